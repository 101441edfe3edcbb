package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/pgtest"
	"github.com/torpor/torpor/projections/sqlview"
	torpor "github.com/torpor/torpor/sdk/go"
)

// testDatabase is the URL of the test database (internal/pgtest: from
// TORPOR_TEST_DATABASE_URL, which .ci/run sets; without one the test fails
// under CI=true and is skipped, loudly, elsewhere). This package may not
// speak SQL itself (TestSQLDriversStayInTheirPackages), so the tests set
// their schemas up with psql, which comes with PostgreSQL: its absence is
// treated as the database's.
func testDatabase(t *testing.T) string {
	t.Helper()
	u := pgtest.URL(t)
	if _, err := exec.LookPath("psql"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI must run serve's SQL view tests, which set up their schemas with psql: %v", err)
		}
		t.Skipf("SKIPPED: serve's SQL view is NOT tested: psql: %v", err)
	}
	return u
}

// psql runs sql on the database at u, failing t on an error.
func psql(t *testing.T, u, sql string) string {
	t.Helper()
	out, err := exec.Command("psql", u, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql).CombinedOutput()
	if err != nil {
		t.Fatalf("psql %q: %v: %s", sql, err, out)
	}
	return strings.TrimSpace(string(out))
}

// sqlSchema creates a schema of t's own in the test database, dropped at
// cleanup, and returns the database's URL with it as search_path (so the
// SQL view's tables land there) and the schema's name.
func sqlSchema(t *testing.T) (string, string) {
	t.Helper()
	base := testDatabase(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	psql(t, base, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { psql(t, base, "DROP SCHEMA "+schema+" CASCADE") })
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		t.Fatalf("TORPOR_TEST_DATABASE_URL %q: want a postgres:// URL (%v)", base, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", schema)
	u.RawQuery = q.Encode()
	return u.String(), schema
}

// dbProxy stands between the service and the database, so that a test can
// take the database away from the service alone: cut closes every
// connection through it and refuses new ones until restore. The shared
// PostgreSQL keeps running for everyone else.
type dbProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// newDBProxy proxies the database of URL u and returns the URL through it.
func newDBProxy(t *testing.T, u string) (*dbProxy, string) {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dbProxy{ln: ln, target: pu.Host, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	pu.Host = ln.Addr().String()
	return p, pu.String()
}

func (p *dbProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(s, c)
		go pipe(c, s)
	}
}

// cut closes every connection through p and refuses new ones.
func (p *dbProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// restore lets connections through again.
func (p *dbProxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// untilTrue waits for cond, checking every few milliseconds, for up to
// a minute; what names what it waits for.
func untilTrue(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute; last: %s", what, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// viewsCaughtUp waits until both views of a hold the whole log.
func viewsCaughtUp(t *testing.T, a *app) {
	t.Helper()
	untilTrue(t, "both views at the head of the log", func() (bool, string) {
		ctx := context.Background()
		kv, kerr := a.ViewLag(ctx)
		sql, serr := a.SQLLag(ctx)
		return kerr == nil && serr == nil && kv == 0 && sql == 0, fmt.Sprintf("kv lag %d (%v), sql lag %d (%v)", kv, kerr, sql, serr)
	})
}

// getJSON answers GET path of a's HTTP API: the status and the body
// decoded (so that JSON that differs only in key order or spacing is
// equal).
func getJSON(t *testing.T, a *app, path string) (int, any) {
	t.Helper()
	code, body := httpDo(t, "GET", "http://"+a.HTTPAddr()+path, "", nil)
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("GET %s: %d %q: %v", path, code, body, err)
	}
	return code, v
}

// answer is one read of the API and what it answered.
type answer struct {
	path string
	code int
	body any
}

// apiReads are the answers of every read the views serve, for the sandboxes
// ids: lists (whole, in pages of 2 following the cursors, by label, by
// phase), counts, each sandbox by id and its history.
func apiReads(t *testing.T, a *app, ids []string) []answer {
	t.Helper()
	var out []answer
	get := func(path string) any {
		code, body := getJSON(t, a, path)
		out = append(out, answer{path, code, body})
		return body
	}
	for _, list := range []string{"/v1/sandboxes?", "/v1/sandboxes?limit=2", "/v1/sandboxes?label=team=a&limit=2",
		"/v1/sandboxes?label=team=b", "/v1/sandboxes?phase=suspended", "/v1/sandboxes?phase=ready&limit=1"} {
		path := list
		for range 20 {
			body, _ := get(path).(map[string]any)
			next, _ := body["next"].(string)
			if next == "" {
				break
			}
			path = list + "&cursor=" + url.QueryEscape(next)
		}
	}
	get("/v1/sandboxes?cursor=not-a-cursor")
	get("/v1/phases")
	for _, id := range ids {
		get("/v1/sandboxes/" + id)
		get("/v1/sandboxes/" + id + "/events")
		get("/v1/sandboxes/" + id + "/events?after=3")
	}
	return out
}

// sameReads fails t where two runs of apiReads differ.
func sameReads(t *testing.T, got, want []answer) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%d reads, want %d", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if got[i].path != want[i].path || got[i].code != want[i].code || !reflect.DeepEqual(got[i].body, want[i].body) {
			g, _ := json.Marshal(got[i].body)
			w, _ := json.Marshal(want[i].body)
			t.Errorf("GET %s from sql: %d %s\nGET %s from kv: %d %s", got[i].path, got[i].code, g, want[i].path, want[i].code, w)
		}
	}
}

// driveSandboxes creates n sandboxes named prefix-i, labelled team=a and team=b and drives some
// through suspend, resume, stop and delete; it returns their ids.
func driveSandboxes(t *testing.T, a *app, prefix string, n int) []string {
	t.Helper()
	c := appClient(a)
	ctx := context.Background()
	var ids []string
	for i := range n {
		team := []string{"a", "b"}[i%2]
		v, err := c.Create(ctx, torpor.CreateRequest{Name: fmt.Sprintf("%s-%d", prefix, i), Driver: "sim", Labels: map[string]string{"team": team, "n": fmt.Sprint(i)}}, "")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		ids = append(ids, v.ID)
	}
	for _, id := range ids {
		mustWait(t, c, id, events.PhaseReady)
	}
	steps := []struct {
		verb   string
		id     string
		target events.Phase
	}{
		{"suspend", ids[0], events.PhaseSuspended},
		{"suspend", ids[1], events.PhaseSuspended},
		{"suspend", ids[2], events.PhaseSuspended},
		{"resume", ids[1], events.PhaseReady},
		{"stop", ids[3], events.PhaseStopped},
		{"delete", ids[4], events.PhaseDeleted},
	}
	for _, s := range steps {
		var err error
		if s.verb == "delete" {
			_, err = c.Delete(ctx, s.id, "")
		} else {
			_, err = c.Lifecycle(ctx, s.verb, s.id, false, "")
		}
		if err != nil {
			t.Fatalf("%s %s: %v", s.verb, s.id, err)
		}
		mustWait(t, c, s.id, s.target)
	}
	return ids
}

// TestServeSQLViewAnswersAsKV: serve with --projection-db and --read-from
// sql, after lifecycle commands on sim sandboxes, answers every read (lists
// with label and phase filters, pages and cursors, counts, gets, histories)
// as the same service on the same log answers them with --read-from kv.
func TestServeSQLViewAnswersAsKV(t *testing.T) {
	db, _ := sqlSchema(t)
	dir := t.TempDir()
	a := startApp(t, dir, func(c *serveConfig) { c.ProjectionDB, c.ReadFrom = db, "sql" })
	ids := driveSandboxes(t, a, "sq1", 7)
	viewsCaughtUp(t, a)
	fromSQL := apiReads(t, a, ids)
	for _, r := range fromSQL {
		if want := map[bool]int{true: 400, false: 200}[strings.Contains(r.path, "not-a-cursor")]; r.code != want {
			t.Errorf("GET %s from sql: %d %v, want %d", r.path, r.code, r.body, want)
		}
	}
	if code, body := getJSON(t, a, "/readyz"); code != 200 || !reflect.DeepEqual(body.(map[string]any)["lag"], map[string]any{"kv": 0.0, "sql": 0.0}) {
		t.Errorf("/readyz caught up: %d %v, want ready with both lags 0", code, body)
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}

	b := startApp(t, dir, func(c *serveConfig) { c.ProjectionDB, c.ReadFrom = db, "kv" })
	viewsCaughtUp(t, b)
	sameReads(t, fromSQL, apiReads(t, b, ids))

	// The SQL view goes on from its checkpoint across restarts, and a
	// service reading sql answers as the one reading kv did.
	all := append(ids, driveSandboxes(t, b, "sq2", 5)...)
	viewsCaughtUp(t, b)
	fromKV := apiReads(t, b, all)
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	c := startApp(t, dir, func(c *serveConfig) { c.ProjectionDB, c.ReadFrom = db, "sql" })
	viewsCaughtUp(t, c)
	sameReads(t, apiReads(t, c, all), fromKV)
}

// readyz is the status and the error message (or "ready") of a's /readyz.
func readyz(t *testing.T, a *app) (int, string) {
	t.Helper()
	code, body := httpDo(t, "GET", "http://"+a.HTTPAddr()+"/readyz", "", nil)
	var eb events.ErrorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error != nil {
		return code, eb.Error.Message
	}
	return code, string(body)
}

// sqlEqualsKV waits until the SQL view's row of every sandbox of ids, read
// through a's HTTP API reading sql, equals its KV view's, and the list
// holds them all.
func sqlEqualsKV(t *testing.T, a *app, ids []string) {
	t.Helper()
	nc := busConn(t, a)
	untilTrue(t, "the SQL view equal to the KV view", func() (bool, string) {
		code, body := getJSON(t, a, "/v1/sandboxes?limit=1000")
		items, _ := body.(map[string]any)["items"].([]any)
		if code != 200 || len(items) != len(ids) {
			return false, fmt.Sprintf("list: %d, %d items of %d", code, len(items), len(ids))
		}
		for _, id := range ids {
			data, _ := json.Marshal(kvView(t, nc, id))
			var kv any
			_ = json.Unmarshal(data, &kv)
			if code, sql := getJSON(t, a, "/v1/sandboxes/"+id); code != 200 || !reflect.DeepEqual(sql, kv) {
				return false, fmt.Sprintf("%s from sql %d %v, kv %v", id, code, sql, kv)
			}
		}
		return true, ""
	})
}

// TestServeSQLViewDatabaseGoesAway: when the SQL view's database goes away
// the service keeps taking commands (their waits read kv), reads from sql
// are UNAVAILABLE, /readyz fails naming the SQL view and its lag; when the
// database returns, the view catches up with the KV view and /readyz is
// ready again.
func TestServeSQLViewDatabaseGoesAway(t *testing.T) {
	db, _ := sqlSchema(t)
	proxy, through := newDBProxy(t, db)
	a := startApp(t, "", func(c *serveConfig) { c.ProjectionDB, c.ReadFrom = through, "sql" })
	ids := driveSandboxes(t, a, "sq3", 5)
	viewsCaughtUp(t, a)
	if code, msg := readyz(t, a); code != 200 {
		t.Fatalf("/readyz before the cut: %d %s", code, msg)
	}

	proxy.cut()
	ids = append(ids, driveSandboxes(t, a, "sq4", 5)...)
	untilTrue(t, "/readyz failing on the SQL view", func() (bool, string) {
		code, msg := readyz(t, a)
		return code == 503 && strings.Contains(msg, "SQL view") && strings.Contains(msg, "events behind") && !strings.Contains(msg, "SQL view 0 events"), fmt.Sprintf("%d %s", code, msg)
	})
	if lag, err := a.SQLLag(context.Background()); err != nil || lag == 0 {
		t.Errorf("SQL view lag %d, %v while its database is away: want events behind", lag, err)
	}
	if lag, err := a.ViewLag(context.Background()); err != nil || lag != 0 {
		untilTrue(t, "the KV view at the head", func() (bool, string) {
			lag, err := a.ViewLag(context.Background())
			return err == nil && lag == 0, fmt.Sprintf("%d %v", lag, err)
		})
	}
	code, body := httpDo(t, "GET", "http://"+a.HTTPAddr()+"/v1/sandboxes", "", nil)
	if code != 503 || !bytes.Contains(body, []byte("UNAVAILABLE")) || !bytes.Contains(body, []byte("SQL view")) {
		t.Errorf("list from sql while its database is away: %d %s, want 503 UNAVAILABLE naming the SQL view", code, body)
	}

	proxy.restore()
	viewsCaughtUp(t, a)
	sqlEqualsKV(t, a, ids)
	untilTrue(t, "/readyz ready again", func() (bool, string) {
		code, msg := readyz(t, a)
		return code == 200, fmt.Sprintf("%d %s", code, msg)
	})
}

// TestServeSQLViewDatabaseDownAtStart: a database that is away when serve
// starts does not stop it: the service takes commands, /readyz says the
// SQL view has not reached its database, and once it is back the view
// opens (migrations and all) and catches up.
func TestServeSQLViewDatabaseDownAtStart(t *testing.T) {
	db, schema := sqlSchema(t)
	proxy, through := newDBProxy(t, db)
	proxy.cut()
	a := startApp(t, "", func(c *serveConfig) { c.ProjectionDB, c.ReadFrom = through, "sql" })
	ids := driveSandboxes(t, a, "sq5", 5)
	if code, msg := readyz(t, a); code != 503 || !strings.Contains(msg, "SQL view") || !strings.Contains(msg, "database not reached") {
		t.Errorf("/readyz with the database away since start: %d %s, want 503 naming the SQL view and its database", code, msg)
	}
	if code, body := httpDo(t, "GET", "http://"+a.HTTPAddr()+"/v1/phases", "", nil); code != 503 {
		t.Errorf("counts from sql with the database away since start: %d %s, want 503", code, body)
	}
	if n := psql(t, testDatabase(t), "SELECT count(*) FROM pg_tables WHERE schemaname = '"+schema+"'"); n != "0" {
		t.Fatalf("%s tables in the schema before the database was reached", n)
	}

	proxy.restore()
	viewsCaughtUp(t, a)
	sqlEqualsKV(t, a, ids)
	untilTrue(t, "/readyz ready", func() (bool, string) {
		code, msg := readyz(t, a)
		return code == 200, fmt.Sprintf("%d %s", code, msg)
	})
}

// serveRefused runs `torpor serve args…` (on random ports, in a temp dir)
// and returns its exit status and stderr; a serve that starts after all is
// stopped after a while, exiting 0.
func serveRefused(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, append([]string{"serve", "--data", t.TempDir(), "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"}, args...), &out, &errb)
	return code, errb.String()
}

// TestServeSQLViewBadInput: serve refuses a malformed --projection-db URL
// and --read-from sql without one as INVALID_ARGUMENT, and a database whose
// schema is newer than the binary's as FAILED_PRECONDITION, saying so.
func TestServeSQLViewBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--projection-db", "postgres://127.0.0.1:notaport/torpor"}, "database url"},
		{[]string{"--projection-db", "host=127.0.0.1 port=5432 sslmode=bogus"}, "database url"},
		{[]string{"--read-from", "sql"}, "--read-from sql"},
		{[]string{"--read-from", "pg"}, "--read-from"},
	} {
		code, stderr := serveRefused(t, tc.args...)
		if code != 2 || !strings.HasPrefix(stderr, "torpor: INVALID_ARGUMENT: ") || !strings.Contains(stderr, tc.want) {
			t.Errorf("serve %v: exit %d, stderr %q; want INVALID_ARGUMENT naming %q", tc.args, code, stderr, tc.want)
		}
	}

	db, schema := sqlSchema(t)
	v, err := sqlview.Open(context.Background(), db, sqlview.Config{})
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
	psql(t, testDatabase(t), "INSERT INTO "+schema+".torpor_schema (version, name) VALUES (999, '0999_from_the_future.sql')")
	code, stderr := serveRefused(t, "--projection-db", db)
	if code != 4 || !strings.HasPrefix(stderr, "torpor: FAILED_PRECONDITION: ") || !strings.Contains(stderr, "newer") {
		t.Errorf("serve on a newer schema: exit %d, stderr %q; want FAILED_PRECONDITION saying the schema is newer", code, stderr)
	}
}
