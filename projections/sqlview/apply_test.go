package sqlview

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/storetest"
)

func applyIn(t *testing.T, v *View, envs []events.Envelope, size int) {
	t.Helper()
	for i := 0; i < len(envs); i += size {
		if err := v.ApplyBatch(context.Background(), envs[i:min(i+size, len(envs))]); err != nil {
			t.Fatalf("ApplyBatch from seq %d: %v", envs[i].Seq, err)
		}
	}
}

// TestApplyTwiceChangesNothing: a batch applied again, in other batch
// bounds, one event at a time, and even with the checkpoint set back to 0
// (so that only the rows' seq guards them) leaves every table as it was and
// folds nothing twice.
func TestApplyTwiceChangesNothing(t *testing.T) {
	d := newDB(t)
	v := d.view(t, DefaultName, nil)
	envs := envelopes(t, append(lifecycle(t), randomScript(t, 7, 12, 250)...))
	applyIn(t, v, envs, 50)
	want, applied := d.dump(t), v.Applied()
	if applied == 0 {
		t.Fatal("nothing applied")
	}

	applyIn(t, v, envs, 37)
	applyIn(t, v, envs[100:160], 1)
	if _, err := d.admin.Exec(context.Background(), `UPDATE torpor_checkpoints SET seq = 0`); err != nil {
		t.Fatal(err)
	}
	applyIn(t, v, envs, 64)
	sameDump(t, d.dump(t), want)
	if got := v.Applied(); got != applied {
		t.Errorf("Applied = %d after the redeliveries, want %d: events folded twice", got, applied)
	}
	if n := d.count(t, `SELECT count(*) FROM torpor_history`); n != len(envs) {
		t.Errorf("history holds %d rows, want one per event: %d", n, len(envs))
	}
}

// TestParkedAndTheRestApplied: events the view cannot apply (data that does
// not decode, data JSONB refuses, an id no view can hold) are parked with
// why and counted once, however often they come; the events around them
// are applied, and one of an unknown type is in the history only.
func TestParkedAndTheRestApplied(t *testing.T) {
	d := newDB(t)
	v := d.view(t, DefaultName, nil)
	a, b := newID(t), newID(t)
	envs := envelopes(t, []ev{
		{a, events.PhaseProvisioning, &events.Created{Name: "a", Driver: "sim", Node: "n1", Generation: 1}},
		{b, events.PhaseProvisioning, &events.Created{Name: "b", Driver: "sim", Node: "n1", Generation: 1}}, // bad data
		{a, events.PhaseReady, &events.Started{Generation: 1}},
		{a, events.PhaseStopped, &events.Stopped{Generation: 1}},      // data with \u0000
		{"bad.id", events.PhaseReady, &events.Started{Generation: 1}}, // no view can hold it
		{a, events.PhaseStopped, &events.Stopped{Generation: 1}},      // a type from the future
		{a, events.PhaseError, &events.Exited{Generation: 1, Code: 7}},
	})
	envs[1].Data = json.RawMessage(`{"name":"b","labels":"not a map"}`)
	envs[3].Data = json.RawMessage(`{"generation":1,"reason":"x\u0000y"}`)
	envs[5].Type = "sandbox.from_the_future"
	for i := range envs { // as the store delivers them: decoded from their body
		envs[i] = reread(t, envs[i])
	}
	applyIn(t, v, envs, len(envs))

	got, err := v.Get(context.Background(), a)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	code := 7
	want := events.View{ID: a, Name: "a", Driver: "sim", Node: "n1", Labels: map[string]string{}, Generation: 1,
		Phase: events.PhaseError, Reason: events.ReasonMainProcessExited, ExitCode: &code, Seq: 7, UpdatedAt: envs[6].Time,
		PhaseSince: envs[6].Time, LastActiveAt: envs[0].Time} // the create: the last activity
	sameJSON(t, "view of a", got, want)
	if _, err := v.Get(context.Background(), b); err == nil {
		t.Errorf("b has a row; its only event was parked")
	}
	if got := v.Parked(); got != 3 {
		t.Errorf("Parked = %d, want 3", got)
	}
	rs, err := d.admin.Query(context.Background(), `SELECT seq, error FROM torpor_parked ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for rs.Next() {
		var seq int64
		var why string
		if err := rs.Scan(&seq, &why); err != nil {
			t.Fatal(err)
		}
		if why == "" {
			t.Errorf("parked seq %d without an error", seq)
		}
		seqs = append(seqs, seq)
	}
	if rs.Err() != nil || len(seqs) != 3 || seqs[0] != 2 || seqs[1] != 4 || seqs[2] != 5 {
		t.Errorf("parked seqs %v (%v), want [2 4 5]", seqs, rs.Err())
	}
	// The event JSONB refuses has no history row; the others, the unknown
	// type's included, have one.
	if n := d.count(t, `SELECT count(*) FROM torpor_history`); n != 6 {
		t.Errorf("history holds %d rows, want 6", n)
	}
	if n := d.count(t, `SELECT count(*) FROM torpor_history WHERE type = 'sandbox.from_the_future'`); n != 1 {
		t.Errorf("the unknown type has %d history rows, want 1", n)
	}

	// Again, and again with the checkpoint back at 0: counted once.
	applyIn(t, v, envs, 2)
	if _, err := d.admin.Exec(context.Background(), `UPDATE torpor_checkpoints SET seq = 0`); err != nil {
		t.Fatal(err)
	}
	applyIn(t, v, envs, len(envs))
	if got := v.Parked(); got != 3 {
		t.Errorf("Parked = %d after redelivery, want 3", got)
	}
	if got := d.view(t, DefaultName, nil).Parked(); got != 3 {
		t.Errorf("Parked = %d on a reopened view, want 3", got)
	}
}

func TestJSONBSafe(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{`{"a":"b"}`, true},
		{`{"a":"\u0041\n\"\\"}`, true},
		{`{"a":"\ud83d\ude00"}`, true},
		{`{"a":"\\u0000"}`, true}, // an escaped backslash, then text
		{`{"a":"\u0000"}`, false},
		{`{"a":"x\U0000"}`, true}, // not an escape JSON has; json.Valid refuses it anyway
		{`{"a":"\ud83d"}`, false},
		{`{"a":"\ude00"}`, false},
		{`{"a":"\ud83d\u0041"}`, false},
	} {
		if got := jsonbSafe([]byte(c.in)); got != c.want {
			t.Errorf("jsonbSafe(%s) = %v, want %v", c.in, got, c.want)
		}
	}
	if strings.Contains(clean("a\x00b\xff"), "\x00") {
		t.Error("clean left a NUL")
	}
}

// reread is env as a reader of the log gets it: decoded from its body,
// without the typed event NewEnvelope keeps.
func reread(t *testing.T, env events.Envelope) events.Envelope {
	t.Helper()
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	out, err := events.DecodeEnvelope(b)
	if err != nil {
		t.Fatal(err)
	}
	out.Seq = env.Seq
	return out
}

// TestForgedEventsParked: well-formed events the lifecycle table refuses
// (storetest.Forged: suspended, deleted, exited on a stopped sandbox, a
// bogus stamped phase, data that is not an object) leave the row as it
// was, whatever phase they are stamped with, and are parked and counted.
func TestForgedEventsParked(t *testing.T) {
	d := newDB(t)
	v := d.view(t, DefaultName, nil)
	a := newID(t)
	envs := envelopes(t, []ev{
		{a, events.PhaseProvisioning, &events.Created{Name: "a", Driver: "sim", Node: "n1", Generation: 1}},
		{a, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{a, events.PhaseStopping, &events.StopRequested{Generation: 1}},
		{a, events.PhaseStopped, &events.Stopped{Generation: 1}},
	})
	applyIn(t, v, envs, len(envs))
	want, err := v.Get(context.Background(), a)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	forged := storetest.Forged(a, 1, t0.Add(time.Minute))
	for i := range forged {
		forged[i].Seq = uint64(len(envs) + 1 + i)
		forged[i] = reread(t, forged[i])
	}
	applyIn(t, v, forged, 2)
	got, err := v.Get(context.Background(), a)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	sameJSON(t, "view of a", got, want)
	if got := v.Parked(); got != uint64(len(forged)) {
		t.Errorf("Parked = %d, want %d", got, len(forged))
	}
}
