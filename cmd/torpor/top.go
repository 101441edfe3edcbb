package main

// torpor top: a live view of the server in the terminal (bubbletea): the
// count of sandboxes per phase, those in a transient phase with their age
// against the deadline, and the latest transitions, all from the watch
// stream, refreshed each second; q, esc or ^C quits. Not on a terminal it
// prints one snapshot (read through list) and exits.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// topRecent is how many transitions top keeps; topTransient how many
// sandboxes in transient phases it lists.
const (
	topRecent    = 12
	topTransient = 15
)

func (f *clientFlags) topCmd() *cobra.Command {
	var (
		deadline time.Duration
		labels   []string
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "a live view of the sandboxes: counts per phase, transient ones against the deadline, the latest transitions (q quits)",
		Long: "top shows, live, the count of sandboxes per phase, the sandboxes in a transient phase\n" +
			"with their age against the deadline the server runs with (read from GET /v1/server;\n" +
			"--deadline overrides it, and is 2m against a server too old to say), and\n" +
			"the latest transitions; q, esc or ^C quits. -l k=v (repeatable: all of them) keeps the\n" +
			"sandboxes with those labels. When stdout is not a terminal, top prints one snapshot\n" +
			"(without transitions) and exits.",
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if deadline <= 0 {
				return events.Errorf(events.CodeInvalidArgument, "--deadline %s: want a positive duration", deadline)
			}
			lf, err := parseLabels(labels)
			if err != nil {
				return err
			}
			c := f.client()
			// The server's own deadline, unless --deadline says otherwise;
			// a server older than GET /v1/server leaves the default, as
			// serve's. Asking also finds a server that is down before the
			// SDK's Watch would retry it for ever.
			info, err := c.Server(cmd.Context())
			switch {
			case err != nil && !errors.Is(err, torpor.ErrNotFound):
				return err
			case err == nil && info.Deadline() > 0 && !cmd.Flags().Changed("deadline"):
				deadline = info.Deadline()
			}
			m := &topModel{views: map[string]events.View{}, deadline: deadline, server: f.serverURL(), filter: lf, started: time.Now(), now: time.Now()}
			out := cmd.OutOrStdout()
			if !terminal(out) || !terminal(cmd.InOrStdin()) {
				return topSnapshot(cmd, c, m, out)
			}
			m.client = c // reads a resume's latency (topresume.go)
			return runTop(cmd, c, m)
		},
	}
	cmd.Flags().DurationVar(&deadline, "deadline", 2*time.Minute, "the deadline to judge transient phases against (default: the server's serve --deadline, read from it)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label k=v (repeatable: all of them)")
	return cmd
}

// topSnapshot prints the screen of top once, from a list of every sandbox.
func topSnapshot(cmd *cobra.Command, c *torpor.Client, m *topModel, out io.Writer) error {
	for cursor := ""; ; {
		p, err := c.List(cmd.Context(), "", m.filter.server(), 1000, cursor)
		if err != nil {
			return err
		}
		for _, v := range p.Items {
			if m.filter.match(v) {
				m.views[v.ID] = v
			}
		}
		if cursor = p.Next; cursor == "" {
			break
		}
	}
	m.snapshot = true
	_, err := fmt.Fprintln(out, m.View())
	return err
}

// runTop runs the live view until the user quits or the context ends.
func runTop(cmd *cobra.Command, c *torpor.Client, m *topModel) error {
	ctx := cmd.Context()
	p := tea.NewProgram(m, tea.WithContext(ctx), tea.WithInput(cmd.InOrStdin()), tea.WithOutput(cmd.OutOrStdout()), tea.WithAltScreen())
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		err := c.Watch(wctx, 0, func(v events.View) error {
			p.Send(viewMsg(v))
			return nil
		})
		if wctx.Err() == nil {
			p.Send(errMsg{err})
		}
	}()
	final, err := p.Run()
	stop()
	<-watched
	switch {
	case errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil:
		return nil // ^C through a signal, SIGTERM
	case err != nil:
		return events.Errorf(events.CodeInternal, "top: %v", err)
	}
	if fm, ok := final.(*topModel); ok && fm.err != nil {
		return fm.err
	}
	return nil
}

// topModel is the state of top: the latest view of every sandbox (that
// passes the filter) and the transitions seen since it started.
type topModel struct {
	views    map[string]events.View
	recent   []transition // newest first
	deadline time.Duration
	server   string
	filter   labelFilter
	started  time.Time
	now      time.Time
	width    int
	err      error
	snapshot bool // printed once, not live
	// client reads the history of a sandbox a resume made ready, for its
	// resume latency (topresume.go); nil: none read.
	client *torpor.Client
}

// transition is a phase change top saw.
type transition struct {
	at       time.Time
	from, to events.Phase
	v        events.View
	// resume is what the transition's resume took, by stage (topresume.go).
	resume string
}

type (
	viewMsg events.View
	tickMsg time.Time
	errMsg  struct{ err error }
)

func tick() tea.Cmd {
	return tea.Tick(time.Second, func(t time.Time) tea.Msg { return tickMsg(t) })
}

func (m *topModel) Init() tea.Cmd { return tick() }

func (m *topModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "esc", "ctrl+c":
			return m, tea.Quit
		}
	case tea.WindowSizeMsg:
		m.width = msg.Width
	case tickMsg:
		m.now = time.Time(msg)
		return m, tick()
	case viewMsg:
		prev := m.views[msg.ID]
		m.see(events.View(msg))
		return m, m.resumeLatency(prev, events.View(msg))
	case resumeMsg:
		m.resumed(msg)
	case errMsg:
		m.err = msg.err
		return m, tea.Quit
	}
	return m, nil
}

// see takes in a view from the stream: a phase that changed (or a sandbox
// created since top started) is a transition; the views the stream opens
// with, of sandboxes top has not seen, are not.
func (m *topModel) see(v events.View) {
	if !m.filter.match(v) {
		delete(m.views, v.ID)
		return
	}
	prev, known := m.views[v.ID]
	m.views[v.ID] = v
	switch {
	case known && prev.Phase == v.Phase:
		return
	case !known && v.UpdatedAt.Before(m.started):
		return
	}
	m.recent = slices.Insert(m.recent, 0, transition{at: time.Now(), from: prev.Phase, to: v.Phase, v: v})
	if len(m.recent) > topRecent {
		m.recent = m.recent[:topRecent]
	}
}

var (
	topTitle = lipgloss.NewStyle().Bold(true)
	topHead  = lipgloss.NewStyle().Bold(true).Underline(true)
	topLate  = lipgloss.NewStyle().Foreground(lipgloss.Color("9")).Bold(true)
	topDim   = lipgloss.NewStyle().Faint(true)
)

func (m *topModel) View() string {
	var b strings.Builder
	now := m.now
	if m.snapshot {
		now = time.Now()
	}
	counts := map[events.Phase]int{}
	var transient []events.View
	for _, v := range m.views {
		counts[v.Phase]++
		if v.Phase.Transient() {
			transient = append(transient, v)
		}
	}
	title := fmt.Sprintf("torpor top  %s  %d sandboxes", m.server, len(m.views))
	if len(m.filter) > 0 {
		title += "  -l " + labelString(m.filter)
	}
	b.WriteString(topTitle.Render(title))
	if !m.snapshot {
		b.WriteString(topDim.Render("  (q quits)"))
	}
	b.WriteString("\n\n")

	b.WriteString(topHead.Render("PHASE") + "           " + topHead.Render("COUNT") + "\n")
	for _, p := range events.Phases {
		fmt.Fprintf(&b, "%-14s %6d\n", p, counts[p])
	}
	for p, n := range counts {
		if !p.Known() {
			fmt.Fprintf(&b, "%-14s %6d\n", p, n) // a phase of a newer server
		}
	}

	fmt.Fprintf(&b, "\n%s (deadline %s)\n", topHead.Render("TRANSIENT"), m.deadline)
	slices.SortFunc(transient, func(a, b events.View) int { return a.UpdatedAt.Compare(b.UpdatedAt) })
	if len(transient) == 0 {
		b.WriteString(topDim.Render("  none") + "\n")
	}
	for i, v := range transient {
		if i == topTransient {
			fmt.Fprintf(&b, "  … and %d more\n", len(transient)-i)
			break
		}
		in := max(now.Sub(v.UpdatedAt), 0)
		line := fmt.Sprintf("  %-20s %-36s %-13s %8s of %s", ref(v), v.ID, v.Phase, in.Round(time.Second), m.deadline)
		if in > m.deadline {
			line = topLate.Render(line + "  PAST THE DEADLINE")
		}
		b.WriteString(line + "\n")
	}

	if !m.snapshot {
		b.WriteString("\n" + topHead.Render("RECENT TRANSITIONS") + "\n")
		if len(m.recent) == 0 {
			b.WriteString(topDim.Render("  none yet") + "\n")
		}
		for _, t := range m.recent {
			from := string(t.from)
			if from == "" {
				from = "(new)"
			}
			fmt.Fprintf(&b, "  %s  %-20s %s → %s%s  seq %d%s\n", t.at.Format(time.TimeOnly), ref(t.v), from, t.to, why(t.v), t.v.Seq, t.resume)
		}
	}
	if m.err != nil {
		b.WriteString("\n" + topLate.Render("watch: "+m.err.Error()) + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}
