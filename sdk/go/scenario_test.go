package torpor_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// scenarioFile is the one scenario list every SDK's tests run
// (sdk/scenarios/README.md says its format).
type scenarioFile struct {
	Version   int        `json:"version"`
	Scenarios []scenario `json:"scenarios"`
}

type scenario struct {
	Name  string `json:"name"`
	Steps []step `json:"steps"`
}

type step struct {
	Call            string            `json:"call"`
	Token           string            `json:"token"`
	Sandbox         string            `json:"sandbox"`
	ID              string            `json:"id"`
	Body            json.RawMessage   `json:"body"`
	Key             string            `json:"key"`
	Phase           events.Phase      `json:"phase"`
	After           string            `json:"after"`
	Query           map[string]string `json:"query"`
	As              string            `json:"as"`
	Expect          map[string]any    `json:"expect"`
	ExpectSame      string            `json:"expect_same"`
	GenerationAbove string            `json:"generation_above"`
	ExpectError     events.Code       `json:"expect_error"`
	ExpectTypes     []string          `json:"expect_types"`
	ExpectCount     map[string]int    `json:"expect_count"`
	ExpectIDs       []string          `json:"expect_ids"`
	TimeoutSeconds  float64           `json:"timeout_seconds"`
	Wait            bool              `json:"wait"`
}

// TestScenarios runs every scenario of sdk/scenarios/scenarios.json through
// this SDK against the real server: the TypeScript and Python SDKs run the
// same file, so the three cannot drift apart.
func TestScenarios(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "scenarios", "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file scenarioFile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields() // a field this runner does not know is a step it would skip
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("scenarios.json: %v", err)
	}
	if file.Version != 1 || len(file.Scenarios) == 0 {
		t.Fatalf("scenarios.json: version %d, %d scenarios; want version 1 and some", file.Version, len(file.Scenarios))
	}
	ctx := ctxFor(t)
	admin := client()
	run := randomHex(t, 4)
	clients := map[string]*torpor.Client{
		"admin":  admin,
		"none":   torpor.New(server.http, nil),
		"forged": torpor.New(server.http, nil).WithToken("torpor_" + strings.Repeat("A", 43)),
	}
	for name, scopes := range map[string][]events.Scope{"write": {events.ScopeRead, events.ScopeWrite}, "read": {events.ScopeRead}} {
		tok, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "scenario-" + run + "-" + name, Scopes: scopes})
		if err != nil {
			t.Fatal(err)
		}
		clients[name] = torpor.New(server.http, nil).WithToken(tok.Token)
	}
	for _, sc := range file.Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			r := &runner{t: t, run: run, clients: clients, saved: map[string]events.View{}}
			for i, st := range sc.Steps {
				r.step(i, st)
			}
		})
	}
}

type runner struct {
	t       *testing.T
	run     string
	clients map[string]*torpor.Client
	saved   map[string]events.View
}

func (r *runner) sub(s string) string { return strings.ReplaceAll(s, "{run}", r.run) }

// ref is the sandbox a step is about.
func (r *runner) ref(i int, st step) string {
	if st.Sandbox != "" {
		v, ok := r.saved[st.Sandbox]
		if !ok {
			r.t.Fatalf("step %d (%s): no sandbox saved as %q", i, st.Call, st.Sandbox)
		}
		return v.ID
	}
	return r.sub(st.ID)
}

func (r *runner) savedSeq(i int, st step, name string) uint64 {
	if name == "" {
		return 0
	}
	v, ok := r.saved[name]
	if !ok {
		r.t.Fatalf("step %d (%s): no view saved as %q", i, st.Call, name)
	}
	return v.Seq
}

func (r *runner) step(i int, st step) {
	t := r.t
	t.Helper()
	token := st.Token
	if token == "" {
		token = "write"
	}
	cl, ok := r.clients[token]
	if !ok {
		t.Fatalf("step %d: token %q: want write, read, admin, none or forged", i, token)
	}
	timeout := 20 * time.Second
	if st.TimeoutSeconds > 0 {
		timeout = time.Duration(st.TimeoutSeconds * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	key := ""
	if st.Key != "" {
		key = r.run + "-" + r.sub(st.Key)
	}
	body := []byte(r.sub(string(st.Body)))
	var (
		v   events.View
		err error
	)
	what := fmt.Sprintf("step %d (%s %s)", i, st.Call, cmpOr(st.Sandbox, st.ID))
	switch st.Call {
	case "create":
		var req torpor.CreateRequest
		if len(body) > 0 {
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatalf("%s: body: %v", what, err)
			}
		}
		if st.Wait {
			v, err = cl.CreateWait(ctx, req, key, waitTimeout(st))
		} else {
			v, err = cl.Create(ctx, req, key)
		}
	case "get":
		v, err = cl.Get(ctx, r.ref(i, st))
	case "start", "stop", "suspend", "delete":
		if st.Wait {
			v, err = cl.LifecycleWait(ctx, st.Call, r.ref(i, st), torpor.ResumeOptions{}, key, waitTimeout(st))
		} else {
			v, err = cl.Lifecycle(ctx, st.Call, r.ref(i, st), false, key)
		}
	case "resume":
		var o torpor.ResumeOptions
		if len(body) > 0 {
			if err := json.Unmarshal(body, &o); err != nil {
				t.Fatalf("%s: body: %v", what, err)
			}
		}
		if st.Wait {
			v, err = cl.LifecycleWait(ctx, st.Call, r.ref(i, st), o, key, waitTimeout(st))
		} else {
			v, err = cl.Resume(ctx, r.ref(i, st), o, key)
		}
	case "wait":
		v, err = cl.WaitAfter(ctx, r.ref(i, st), st.Phase, r.savedSeq(i, st, st.After), timeout)
	case "watch":
		v, err = r.watch(ctx, cl, i, st, timeout)
	case "history":
		var h []torpor.Event
		h, err = cl.History(ctx, r.ref(i, st), 0)
		if err == nil {
			r.history(what, st, h)
		}
	case "list":
		var ids []string
		ids, err = r.list(ctx, cl, st)
		if err == nil {
			var want []string
			for _, name := range st.ExpectIDs {
				want = append(want, r.saved[name].ID)
			}
			slices.Sort(ids)
			slices.Sort(want)
			if !slices.Equal(ids, want) {
				t.Fatalf("%s: listed %v, want %v (%v)", what, ids, want, st.ExpectIDs)
			}
		}
	default:
		t.Fatalf("%s: unknown call", what)
	}
	if st.ExpectError != "" {
		if got := events.CodeOf(err); err == nil || got != st.ExpectError {
			t.Fatalf("%s: got %v (code %q), want an error %s", what, err, got, st.ExpectError)
		}
		if st.Expect != nil {
			r.expect(what, v, st) // the view a timed-out wait=true answered beside its error
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if st.Call == "history" || st.Call == "list" {
		return
	}
	if st.Expect != nil {
		r.expect(what, v, st)
	}
	if st.ExpectSame != "" {
		want := r.saved[st.ExpectSame]
		if v.ID != want.ID || v.Seq != want.Seq {
			t.Fatalf("%s: answered %s at seq %d, want the view saved as %s: %s at seq %d", what, v.ID, v.Seq, st.ExpectSame, want.ID, want.Seq)
		}
	}
	if st.GenerationAbove != "" {
		if prev := r.saved[st.GenerationAbove]; v.Generation <= prev.Generation {
			t.Fatalf("%s: generation %d, want above %d (%s)", what, v.Generation, prev.Generation, st.GenerationAbove)
		}
	}
	if st.As != "" {
		r.saved[st.As] = v
	}
}

// expect fails the step unless v holds st.Expect.
func (r *runner) expect(what string, v events.View, st step) {
	r.t.Helper()
	raw, _ := json.Marshal(v)
	var got map[string]any
	_ = json.Unmarshal(raw, &got)
	if path, ok := holds(got, r.subAll(st.Expect), ""); !ok {
		r.t.Fatalf("%s: the view %s does not hold %v (at %s)", what, raw, st.Expect, path)
	}
}

// waitTimeout is the wait of a command step with wait: timeout_seconds,
// else the server's default (0).
func waitTimeout(st step) time.Duration {
	return time.Duration(st.TimeoutSeconds * float64(time.Second))
}

func (r *runner) subAll(m map[string]any) map[string]any {
	raw, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal([]byte(r.sub(string(raw))), &out)
	return out
}

// holds reports whether got holds every field of want (objects by the same
// rule, anything else equal), and where it does not.
func holds(got, want map[string]any, at string) (string, bool) {
	for k, w := range want {
		g, ok := got[k]
		if wm, isMap := w.(map[string]any); isMap {
			gm, _ := g.(map[string]any)
			if !ok || gm == nil {
				return at + k, false
			}
			if path, ok := holds(gm, wm, at+k+"."); !ok {
				return path, false
			}
			continue
		}
		if !ok && w == "" {
			continue // a field omitted when empty
		}
		if !ok || !reflect.DeepEqual(g, w) {
			return at + k, false
		}
	}
	return "", true
}

func (r *runner) history(what string, st step, h []torpor.Event) {
	t := r.t
	var types []string
	count := map[string]int{}
	for _, e := range h {
		types = append(types, e.Type)
		count[e.Type]++
	}
	next := 0
	for _, typ := range types {
		if next < len(st.ExpectTypes) && typ == st.ExpectTypes[next] {
			next++
		}
	}
	if next < len(st.ExpectTypes) {
		t.Fatalf("%s: the history %v lacks %v in that order (found up to %d)", what, types, st.ExpectTypes, next)
	}
	for typ, n := range st.ExpectCount {
		if count[typ] != n {
			t.Fatalf("%s: %d events %s in the history %v, want %d", what, count[typ], typ, types, n)
		}
	}
}

func (r *runner) list(ctx context.Context, cl *torpor.Client, st step) ([]string, error) {
	var ids []string
	cursor := ""
	for {
		page, err := cl.List(ctx, r.sub(st.Query["phase"]), r.sub(st.Query["label"]), 1000, cursor)
		if err != nil {
			return nil, err
		}
		for _, v := range page.Items {
			ids = append(ids, v.ID)
		}
		if cursor = page.Next; cursor == "" {
			return ids, nil
		}
	}
}

// watch collects the views of the step's sandbox after the saved view's
// seq until one is in the step's phase; every one must be above after and
// above the one before.
func (r *runner) watch(ctx context.Context, cl *torpor.Client, i int, st step, timeout time.Duration) (events.View, error) {
	id := r.ref(i, st)
	after := r.savedSeq(i, st, st.After)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last events.View
	seen := after
	found := fmt.Errorf("found")
	err := cl.Watch(ctx, after, func(v events.View) error {
		if v.ID != id {
			return nil
		}
		if v.Seq <= seen {
			return fmt.Errorf("view at seq %d after one at %d (watch after %d): a view twice or out of order", v.Seq, seen, after)
		}
		seen, last = v.Seq, v
		if v.Phase == st.Phase {
			return found
		}
		return nil
	})
	if err == found {
		return last, nil
	}
	return last, err
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
