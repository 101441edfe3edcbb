package node

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestActorsStopInReverse: the parts stop one at a time, the last started
// first, each waited for before the one before it is stopped; whether the
// node's context ends or a part fails, whose error names it.
func TestActorsStopInReverse(t *testing.T) {
	for _, c := range []struct {
		name    string
		fail    string // the part that fails at once, "" for none
		wantErr string
	}{
		{"the context ends", "", ""},
		{"a part fails", "views", "views: boom"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var stopped []string
			running := make(chan string, 3)
			g := newActors(context.Background())
			for _, name := range []string{"bus", "views", "http"} {
				g.add(name, func(ctx context.Context) error {
					running <- name
					if name == c.fail {
						return errors.New("boom")
					}
					<-ctx.Done()
					if name == "http" {
						// Slow to stop: a part stopped before it returned
						// would be recorded first.
						time.Sleep(20 * time.Millisecond)
					}
					mu.Lock()
					defer mu.Unlock()
					// Every part started after this one has stopped already.
					stopped = append(stopped, name)
					return nil
				})
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- g.run(ctx, zerolog.Nop()) }()
			for range 3 {
				<-running
			}
			if c.fail == "" {
				cancel()
			}
			err := <-done
			cancel()
			if got := errString(err); got != c.wantErr {
				t.Errorf("run: %q, want %q", got, c.wantErr)
			}
			want := []string{"http", "views", "bus"}
			want = slices.DeleteFunc(want, func(s string) bool { return s == c.fail })
			if !slices.Equal(stopped, want) {
				t.Errorf("stopped %v, want %v", stopped, want)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return strings.TrimSpace(err.Error())
}

// TestNodePartsAreActors: a node's long-running parts are actors, the KV
// view's follower (which every wait is served from) first, so that it
// stops last, after the HTTP API that serves the waits and the parts that
// lean on it; the HTTP API last, so that it stops first.
func TestNodePartsAreActors(t *testing.T) {
	n := startNode(t, testConfig(t, "n1"))
	if len(n.parts) < 2 || n.parts[0] != "kvfollow" || n.parts[len(n.parts)-1] != "http" {
		t.Errorf("the node's parts in their order of start: %v; want kvfollow first and http last", n.parts)
	}
}
