package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/node"
)

// scrape reads a's GET /metrics: the raw text and its families by name.
func scrape(t *testing.T, a *app) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.HTTPAddr()+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v\n%s", resp.StatusCode, err, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return body, fams
}

// sample is the value of the series of family name whose labels include
// want (a counter's or a gauge's value, a histogram's count), summed over
// the series that match, and whether any did.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	var sum float64
	found := false
outer:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue outer
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}

// TestMetrics drives sim sandboxes through what each metric counts (a
// create/suspend/resume cycle, over HTTP and the bus, a command in the
// wrong phase, a forged and a stale supervisor report, a foreign message
// and an event the KV view parks, a suspension that hangs past its
// deadline) and reads GET /metrics of the real serve: every metric is there
// and moved. Then every metric the Grafana dashboard queries is on that
// /metrics, and promtool finds nothing wrong with it.
func TestMetrics(t *testing.T) {
	a := startAppUnchecked(t, "", func(c *serveConfig) { c.Deadline = 2 * time.Second })
	c := appClient(a)
	nc := busConn(t, a)
	ctx := context.Background()
	js, _ := jetstream.New(nc)

	// A create/suspend/resume cycle over HTTP.
	v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := v.ID
	mustWait(t, c, id, events.PhaseReady)
	// A command in the wrong phase: resume of a ready sandbox never suspended.
	if _, err := c.Lifecycle(ctx, "resume", id, false, ""); events.CodeOf(err) != events.CodeFailedPrecondition {
		t.Fatalf("resume of a ready sandbox: %v, want FAILED_PRECONDITION", err)
	}
	// A foreign message on the sandbox's subject: the readers skip it, and
	// the gateway's next append, which expects the subject's sequence it
	// knew, meets a conflict and is retried.
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: jsstore.Subject(id), Data: []byte("not a torpor event")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lifecycle(ctx, "suspend", id, false, ""); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	mustWait(t, c, id, events.PhaseSuspended)
	if _, err := c.Lifecycle(ctx, "resume", id, false, ""); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if v := mustWait(t, c, id, events.PhaseReady); v.Generation != 2 {
		t.Fatalf("resumed as generation %d, want 2", v.Generation)
	}

	// Two touches within the activity window: one sandbox.active.
	for range 2 {
		if _, err := c.Touch(ctx, id, ""); err != nil {
			t.Fatalf("touch: %v", err)
		}
	}

	// Supervisor reports that are fenced: a forged credential, and an exit
	// of generation 1 with its real credential now that 2 runs.
	if code := sendReport(t, nc, compute.Report{SandboxID: id, Generation: 2, Credential: "forged", Kind: compute.ReportExited, ExitCode: 1}); code != events.CodeUnauthenticated {
		t.Fatalf("forged report answered %q, want UNAUTHENTICATED", code)
	}
	creds, err := node.Credentials(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	if code := sendReport(t, nc, compute.Report{SandboxID: id, Generation: 1, Credential: creds.Mint(id, 1), Kind: compute.ReportExited, ExitCode: 1}); code != events.CodeFailedPrecondition {
		t.Fatalf("stale report answered %q, want FAILED_PRECONDITION", code)
	}

	// An event the KV view cannot apply (the lifecycle table refuses it: a
	// stop of a sandbox never created) is parked.
	bad := "0193b0a4-0000-7000-8000-0000000000ba"
	env, _ := json.Marshal(events.Envelope{ID: "parked-1", SandboxID: bad, Type: events.TypeStopped, Schema: 1, Data: json.RawMessage(`{}`)})
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: jsstore.Subject(bad), Data: env, Header: nats.Header{jsstore.HeaderType: []string{events.TypeStopped}}}); err != nil {
		t.Fatal(err)
	}

	// A suspension that hangs, created over the bus: its deadline fires.
	hang, berr := busCmd(t, nc, "create", map[string]any{"driver": "sim", "driver_options": map[string]string{"suspend": "hang"}}, nil)
	if berr != nil {
		t.Fatalf("create over the bus: %v", berr)
	}
	mustWait(t, c, hang.ID, events.PhaseReady)
	if _, berr := busCmd(t, nc, "suspend", map[string]any{"id": hang.ID}, nil); berr != nil {
		t.Fatalf("suspend over the bus: %v", berr)
	}
	waitCtx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	for {
		v, err := c.Get(waitCtx, hang.ID)
		if err == nil && v.Phase == events.PhaseReady && v.LastOutcome == events.OutcomeSuspendTimedOut {
			break
		}
		if waitCtx.Err() != nil {
			t.Fatalf("the hung suspension's deadline did not settle it: %+v, %v", v, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Each metric moved for what the test did. Some are counted when the
	// view or the sagas get there: scrape until all are, within waitFor.
	type want struct {
		name   string
		labels map[string]string
		min    float64
		exact  bool // the value is min, no more: counted once
	}
	wants := []want{
		{"torpor_sandboxes", map[string]string{"phase": "ready"}, 2, false},
		{"torpor_transitions_total", map[string]string{"from": "none", "to": "provisioning"}, 2, true},
		{"torpor_transitions_total", map[string]string{"from": "ready", "to": "suspending"}, 2, true},
		{"torpor_transitions_total", map[string]string{"from": "suspended", "to": "starting"}, 1, true},
		{"torpor_deadline_firings_total", map[string]string{"phase": "suspending"}, 1, true},
		{"torpor_command_duration_seconds", map[string]string{"verb": "create", "code": "OK"}, 2, false},
		{"torpor_command_duration_seconds", map[string]string{"verb": "suspend", "code": "OK"}, 2, false},
		{"torpor_command_duration_seconds", map[string]string{"verb": "resume", "code": "OK"}, 1, false},
		{"torpor_command_duration_seconds", map[string]string{"verb": "resume", "code": "FAILED_PRECONDITION"}, 1, false},
		{"torpor_saga_step_duration_seconds", map[string]string{"saga": "suspend", "step": "suspend", "outcome": "ok"}, 1, false},
		{"torpor_saga_step_duration_seconds", map[string]string{"saga": "suspend", "step": "suspend", "outcome": "deadline"}, 1, false},
		{"torpor_saga_step_duration_seconds", map[string]string{"saga": "resume", "step": "record", "outcome": "ok"}, 1, false},
		{"torpor_saga_step_duration_seconds", map[string]string{"saga": "deadline", "step": "record", "outcome": "ok"}, 1, false},
		{"torpor_driver_call_duration_seconds", map[string]string{"driver": "sim", "op": "start", "code": "OK"}, 2, false},
		{"torpor_driver_call_duration_seconds", map[string]string{"driver": "sim", "op": "resume", "code": "OK"}, 1, false},
		{"torpor_driver_call_duration_seconds", map[string]string{"driver": "sim", "op": "observe", "code": "OK"}, 1, false},
		// The resume's ready stage (README "Resume latency"): one resume,
		// one attach of its generation; the sim says no driver stage.
		{"torpor_resume_latency_seconds", map[string]string{"driver": "sim", "stage": "ready"}, 1, true},
		{"torpor_projection_lag_events", map[string]string{"view": "kv"}, 0, false},
		{"torpor_parked_events_total", map[string]string{"view": "kv"}, 1, false},
		{"torpor_foreign_messages_total", nil, 1, false},
		{"torpor_fenced_reports_total", map[string]string{"reason": "credential"}, 1, false},
		{"torpor_fenced_reports_total", map[string]string{"reason": "generation"}, 1, false},
		{"torpor_append_conflicts_total", nil, 1, false},
		{"torpor_append_retries_total", nil, 1, false},
		{"torpor_activity_total", map[string]string{"source": "touch"}, 1, true},
		{"go_goroutines", nil, 1, false},
		{"process_cpu_seconds_total", nil, 0, false},
	}
	var (
		text []byte
		fams map[string]*dto.MetricFamily
		miss []string
	)
	for deadline := time.Now().Add(waitFor); ; {
		text, fams = scrape(t, a)
		miss = miss[:0]
		for _, w := range wants {
			if got, ok := sample(fams, w.name, w.labels); !ok || got < w.min || (w.exact && got != w.min) {
				miss = append(miss, w.name+metricLabels(w.labels)+": "+metricValue(got, ok))
			}
		}
		if len(miss) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(miss) > 0 {
		t.Fatalf("metrics that did not move as the test made them:\n  %s\n/metrics:\n%s", strings.Join(miss, "\n  "), text)
	}

	t.Run("dashboard queries only metrics served", func(t *testing.T) {
		names := dashboardMetrics(t, "../../deploy/grafana/torpor.json")
		if len(names) == 0 {
			t.Fatal("the dashboard queries no torpor metric")
		}
		for _, n := range names {
			if _, ok := fams[n]; !ok {
				t.Errorf("the dashboard queries %s, which /metrics does not serve", n)
			}
		}
	})

	t.Run("promtool check metrics", func(t *testing.T) {
		promtool, err := exec.LookPath("promtool")
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("promtool not found (Debian's prometheus package; .ci/run installs it)")
			}
			t.Skip("!!! promtool not found: /metrics NOT linted. Install it: apt-get install -y --no-install-recommends prometheus !!!")
		}
		cctx, cancel := context.WithTimeout(ctx, waitFor)
		defer cancel()
		cmd := exec.CommandContext(cctx, promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(text)
		out, err := cmd.CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Fatalf("promtool check metrics: %v\n%s", err, out)
		}
	})
}

func metricLabels(l map[string]string) string {
	if len(l) == 0 {
		return ""
	}
	var parts []string
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

func metricValue(v float64, ok bool) string {
	if !ok {
		return "absent"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// metricName is a torpor metric in a PromQL expression; a histogram's
// series suffixes are the histogram's.
var metricName = regexp.MustCompile(`torpor_[a-z_]+`)

// dashboardMetrics is every torpor metric the expressions of the panels'
// targets (and the template variables' queries) of the dashboard at path
// name.
func dashboardMetrics(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		SchemaVersion int `json:"schemaVersion"`
		Panels        []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if d.SchemaVersion < 39 {
		t.Errorf("%s: schemaVersion %d, want 39 or later", path, d.SchemaVersion)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Errorf("%s: no Prometheus datasource variable named datasource", path)
	}
	if !strings.Contains(string(data), `"uid": "${datasource}"`) {
		t.Errorf("%s: panels do not use ${datasource}", path)
	}
	seen := map[string]bool{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q queries nothing", path, p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					n = strings.TrimSuffix(n, suffix)
				}
				seen[n] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
