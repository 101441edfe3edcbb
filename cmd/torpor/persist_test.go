package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/projections/kvview"
	torpor "github.com/torpor/torpor/sdk/go"
)

// TestKillUnderLoadViewAgreesWithTheLog kills `torpor serve` (SIGKILL, the
// embedded server with it) at a random moment while clients suspend and
// resume sandboxes, three times, starting it again on the same data
// directory each time; once the restarted service has caught up, the
// independent checker passes over the log, and the phase view (its bucket
// made with asynchronous persistence: issue 28) and the clients' copy of it
// equal a fresh rebuild of the log, key for key.
//
// What it can prove: whatever the kill interrupts (a view write buffered in
// the server's memory and not written out yet, which an async bucket loses
// with the process, a checkpoint, an append, a saga step), the restarted
// service brings the view back to what the log says. What it cannot: a
// SIGKILL loses nothing the server handed to the kernel, which keeps it in
// the page cache, so the losses a machine crash makes (unsynced pages, the
// tail of an async stream that was written out but not synced) do not
// happen here, and whether a given kill lost any view write is chance.
// kvview's TestAsyncBucketThatLostWritesIsFoldedAgain makes those losses
// by hand and proves the recovery path on them.
func TestKillUnderLoadViewAgreesWithTheLog(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 28))
	var ids []string
	for round := range 4 {
		c := serveProcess(t, dir)
		if round == 0 {
			for i := range 12 {
				v, err := c.client().Create(ctx, torpor.CreateRequest{Name: "load-" + strconv.Itoa(i), Driver: "sim"}, "")
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, v.ID)
			}
		} else {
			agrees(t, c, round)
		}
		if round == 3 {
			c.kill()
			return
		}
		// Load, then the kill at a random moment of it (not a wait for
		// anything: the moment is the point).
		lctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cycle(lctx, c.client(), id)
			}()
		}
		time.Sleep(time.Duration(300+r.IntN(1500)) * time.Millisecond)
		c.kill()
		stop()
		wg.Wait()
	}
}

// cycle suspends and resumes sandbox id until ctx ends, going past the
// errors a killed service answers.
func cycle(ctx context.Context, c *torpor.Client, id string) {
	for ctx.Err() == nil {
		v, err := c.Get(ctx, id)
		if err != nil {
			return
		}
		verb, want := "", events.PhaseReady
		switch v.Phase {
		case events.PhaseReady:
			verb, want = "suspend", events.PhaseSuspended
		case events.PhaseSuspended:
			verb = "resume"
		}
		after := v.Seq
		if verb != "" {
			acc, err := c.Lifecycle(ctx, verb, id, false, "")
			if err != nil {
				return
			}
			after = acc.Seq
		}
		if _, err := c.WaitAfter(ctx, id, want, after, 5*time.Second); err != nil && ctx.Err() == nil && verb != "" {
			return
		}
	}
}

// agrees waits until the view of the service c has applied the whole log,
// then checks the log with the checker and compares the view with a fresh
// rebuild (bucket check_<round>), for as long as the log's head moves (the
// sagas finish what the kill interrupted).
func agrees(t *testing.T, c *child, round int) {
	t.Helper()
	ctx := context.Background()
	nc, err := nats.Connect(c.nats, serviceOptions(t, c.dir)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := jsstore.Bind(ctx, js, "")
	if err != nil {
		t.Fatal(err)
	}
	live, err := js.KeyValue(ctx, "torpor_phases")
	if err != nil {
		t.Fatal(err)
	}
	// The clients' account's copy of the view (a mirror): it must follow
	// the view through the crashes too.
	cu, err := busauth.Open(filepath.Join(c.dir, "auth"), busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	u, err := cu.User("test copies", time.Hour, busauth.Grant{Role: busauth.ClientsService})
	if err != nil {
		t.Fatal(err)
	}
	cnc, err := nats.Connect(c.nats, u.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cnc.Close()
	cjs, err := jetstream.New(cnc)
	if err != nil {
		t.Fatal(err)
	}
	clientsCopy, err := cjs.KeyValue(ctx, busauth.PhaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := js.Stream(ctx, "KV_torpor_phases"); err != nil || s.CachedInfo().Config.PersistMode != jetstream.AsyncPersistMode {
		t.Fatalf("the view's bucket: %v, want async persistence (%v)", s.CachedInfo().Config.PersistMode, err)
	}
	deadline := time.Now().Add(waitFor)
	for try := 0; ; try++ {
		head, err := store.LastSeq(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if lag := viewLag(c); lag != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the view stayed %d events behind the log", round, lag)
			}
			time.Sleep(20 * time.Millisecond) // polls /readyz
			continue
		}
		bucket := "check_" + strconv.Itoa(round) + "_" + strconv.Itoa(try)
		if _, err := kvview.Rebuild(ctx, js, store, kvview.Config{Bucket: bucket, MaxBytes: 16 << 20}); err != nil {
			t.Fatal(err)
		}
		fresh, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		diffs := differ(t, live, fresh)
		for _, d := range differ(t, live, clientsCopy) {
			diffs = append(diffs, "the clients' copy: "+d)
		}
		if err := js.DeleteKeyValue(ctx, bucket); err != nil {
			t.Fatal(err)
		}
		if again, err := store.LastSeq(ctx); err == nil && again == head && len(diffs) == 0 {
			vs, err := check.Replay(ctx, store, check.Options{})
			if err != nil || len(vs) > 0 {
				t.Fatalf("round %d: the checker over the log: %v, violations %v", round, err, vs)
			}
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("round %d: the view differs from a rebuild of the log (head %d): %s", round, head, strings.Join(diffs, "; "))
		}
	}
}

// viewLag is how many events the view of c has yet to apply, as /readyz
// says (-1 while it is not ready).
func viewLag(c *child) int64 {
	resp, err := http.Get("http://" + c.http + "/readyz")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var body struct {
		Lag map[string]int64 `json:"lag"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil {
		return -1
	}
	if lag, ok := body.Lag["kv"]; ok {
		return lag
	}
	return -1
}

// differ lists the keys where the two buckets differ (at most five).
func differ(t *testing.T, a, b jetstream.KeyValue) []string {
	t.Helper()
	da, db := values(t, a), values(t, b)
	var out []string
	for k, va := range da {
		if vb, ok := db[k]; !ok || vb != va {
			out = append(out, k+": view "+va+", rebuild "+vb)
		}
	}
	for k, vb := range db {
		if _, ok := da[k]; !ok {
			out = append(out, k+": no view, rebuild "+vb)
		}
	}
	return out[:min(len(out), 5)]
}

// values is every key of kv and its value.
func values(t *testing.T, kv jetstream.KeyValue) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = string(e.Value())
	}
	return out
}
