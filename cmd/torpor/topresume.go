package main

// torpor top's resume latency: a transition into ready that a restore made
// shows what the resume took by stage, as the metric and the bench define
// it (README "Resume latency"), read from the sandbox's history.

import (
	"context"
	"fmt"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/torpor/torpor/events"
)

// resumeMsg is the resume latency of the transition of sandbox id into
// ready at seq, as resumeText says it.
type resumeMsg struct {
	id   string
	seq  uint64
	text string
}

// resumeLatency reads, when v (after prev) is a sandbox a restore made
// ready, its history and answers what the resume took; nil otherwise.
func (m *topModel) resumeLatency(prev, v events.View) tea.Cmd {
	if m.client == nil || v.Phase != events.PhaseReady || prev.Phase == events.PhaseReady || v.LastOutcome != events.OutcomeRestored || !m.filter.match(v) {
		return nil
	}
	c := m.client
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h, err := c.History(ctx, v.ID, 0)
		if err != nil {
			return nil
		}
		gen, st, err := events.ResumeStages(h)
		if err != nil {
			return nil
		}
		return resumeMsg{id: v.ID, seq: v.Seq, text: resumeText(gen, v, st)}
	}
}

// resumed puts msg on its transition.
func (m *topModel) resumed(msg resumeMsg) {
	for i, t := range m.recent {
		if t.v.ID == msg.id && t.v.Seq == msg.seq {
			m.recent[i].resume = msg.text
		}
	}
}

// resumeText is what a resume that minted generation gen took, by stage
// (st, from the command accepted), for view v: "" when the resume is not
// what made v ready (another generation, no attach of it yet).
func resumeText(gen int64, v events.View, st map[string]time.Duration) string {
	if gen != v.Generation {
		return ""
	}
	if _, ok := st[events.StageReady]; !ok {
		return ""
	}
	var parts []string
	for _, stage := range events.ResumeStageNames {
		if d, ok := st[stage]; ok {
			parts = append(parts, fmt.Sprintf("→%s %s", stage, d.Round(time.Millisecond)))
		}
	}
	return "  resume " + strings.Join(parts, " ")
}
