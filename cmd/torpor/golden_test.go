package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

var updateGolden = flag.Bool("update", false, "rewrite cmd/torpor/testdata/http/*.json from what the server answers")

// What changes from run to run in an answer, each with what stands for it
// in a golden file: ids, times, sequence numbers, the sim's digests.
var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`), "UUID"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`), "TIME"},
	{regexp.MustCompile(`"(seq|after|generation_seq)":\d+`), `"$1":0`},
	{regexp.MustCompile(`"restore_ref":"sim:UUID:(\d+):[0-9a-f]+"`), `"restore_ref":"sim:UUID:$1:DIGEST"`},
	{regexp.MustCompile(`"env_sealed":"[A-Za-z0-9+/]+"`), `"env_sealed":"SEALED"`}, // a fresh nonce each time
}

// anyResumer stands for the actor of the history's sandbox.resumed: the
// resume saga records it, or the new generation's supervisor does as it
// attaches, whichever comes first (a CI run had the saga where the golden
// file has the supervisor). The rest of the history, and every field, is as
// the server wrote it.
func anyResumer(t *testing.T, body []byte) []byte {
	t.Helper()
	var h struct {
		Items []json.RawMessage `json:"items"`
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || len(top) != 1 {
		t.Fatalf("history: %v; want only items (a new field is to be kept here)\n%s", err, body)
	}
	if err := json.Unmarshal(body, &h); err != nil {
		t.Fatalf("history: %v\n%s", err, body)
	}
	for i, item := range h.Items {
		var e struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(item, &e) == nil && e.Type == events.TypeResumed {
			h.Items[i] = resumer.ReplaceAll(item, []byte(`"actor":"RESUMER"`))
		}
	}
	out, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// resumer is the actor of a sandbox.resumed, either of the two.
var resumer = regexp.MustCompile(`"actor":"(sagas|supervisor:\d+)"`)

// golden compares body, normalized and indented (the fields in the order
// the server writes them), with testdata/http/name.json, or writes it with
// -update. The files guard the HTTP API's JSON: a field renamed, dropped
// or moved shows up as a diff here.
func golden(t *testing.T, name string, body []byte) {
	t.Helper()
	for _, v := range volatile {
		body = v.re.ReplaceAll(body, []byte(v.with))
	}
	var out bytes.Buffer
	if err := json.Indent(&out, bytes.TrimSpace(body), "", "  "); err != nil {
		t.Fatalf("%s: not JSON: %v\n%s", name, err, body)
	}
	out.WriteByte('\n')
	path := filepath.Join("testdata", "http", name+".json")
	if *updateGolden {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v (run go test ./cmd/torpor -run TestHTTPGolden -update to write it)", name, err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("%s: the HTTP JSON changed (fields are only added; if this is an addition, -update):\n--- got\n%s--- want (%s)\n%s", name, out.Bytes(), path, want)
	}
}

// TestHTTPGolden drives one sim sandbox through the API and compares each
// kind of answer — a view, a page, a history, the phase counts, the
// drivers, a watch event and the contract's error bodies — with its golden
// file, and each status with the contract's.
func TestHTTPGolden(t *testing.T) {
	a := startApp(t, "", nil)
	base := "http://" + a.HTTPAddr()
	call := func(method, path, body string, want int) []byte {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d, want %d\n%s", method, path, resp.StatusCode, want, data)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
		}
		return data
	}
	created := call("POST", "/v1/sandboxes", `{"name":"golden","driver":"sim","labels":{"team":"a"},"command":["sleep","1"],"env":{"K":"V"}}`, 201)
	golden(t, "create", created)
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(created, &v); err != nil || v.ID == "" {
		t.Fatalf("create: %s", created)
	}
	sb := "/v1/sandboxes/" + v.ID
	golden(t, "wait-ready", call("GET", sb+"/wait?phase=ready&timeout=10s", "", 200))
	golden(t, "suspend", call("POST", sb+"/suspend", "", 202))
	golden(t, "wait-suspended", call("GET", sb+"/wait?phase=suspended&timeout=10s", "", 200))
	golden(t, "resume", call("POST", sb+"/resume", `{"restart_if_restore_fails":true}`, 202))
	ready := call("GET", sb+"/wait?phase=ready&timeout=10s&after=1", "", 200)
	golden(t, "wait-resumed", ready)
	golden(t, "get", call("GET", "/v1/sandboxes/golden", "", 200))
	golden(t, "list", call("GET", "/v1/sandboxes?label=team=a&limit=1", "", 200))
	golden(t, "history", anyResumer(t, call("GET", sb+"/events", "", 200)))
	golden(t, "phases", call("GET", "/v1/phases", "", 200))
	golden(t, "drivers", call("GET", "/v1/drivers", "", 200))
	golden(t, "server", call("GET", "/v1/server", "", 200))

	// The contract's error bodies, each with its status.
	golden(t, "error-not-found", call("GET", "/v1/sandboxes/nobody", "", 404))
	call("POST", sb+"/stop", "", 202)
	call("GET", sb+"/wait?phase=stopped&timeout=10s", "", 200)
	golden(t, "error-failed-precondition", call("POST", sb+"/resume", "", 409))
	golden(t, "error-invalid-argument", call("POST", "/v1/sandboxes", `{"name":`, 400))
	golden(t, "error-already-exists", call("POST", "/v1/sandboxes", `{"name":"golden","driver":"sim"}`, 409))
	golden(t, "error-wait-timeout", call("GET", sb+"/wait?phase=suspended&timeout=50ms", "", 504))

	// A watch event: the data line is a view.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/watch", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("watch: Content-Type %q, want text/event-stream", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var id string
	for sc.Scan() {
		line := sc.Text()
		if s, ok := strings.CutPrefix(line, "id: "); ok {
			id = s
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			if id == "" {
				t.Errorf("watch: a data line before its id line")
			}
			var seq struct {
				Seq uint64 `json:"seq"`
			}
			if err := json.Unmarshal([]byte(data), &seq); err != nil || fmt.Sprint(seq.Seq) != id {
				t.Errorf("watch: id %q, data's seq %d (%v)", id, seq.Seq, err)
			}
			golden(t, "watch-event", []byte(data))
			break
		}
	}
	if id == "" {
		t.Fatalf("watch: no event (%v)", sc.Err())
	}
}
