package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/memstore"
	"github.com/torpor/torpor/events/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) events.Store { return memstore.New() })
}

func TestFollowFillsBatchesFromWhatTheLogHolds(t *testing.T) {
	s := memstore.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var last uint64
	for i := range 10 {
		env := storetest.NewEnvelope(t, "sbx1", &events.Started{Generation: int64(i)})
		var err error
		if last, err = s.Append(ctx, "sbx1", last, env); err != nil {
			t.Fatal(err)
		}
	}
	// Everything is in the log before Follow starts: every batch is full
	// but the last, and pending counts what is left.
	var got []string
	err := s.Follow(ctx, 0, 3, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
		got = append(got, fmt.Sprintf("%d-%d+%d", envs[0].Seq, envs[len(envs)-1].Seq, pending))
		if pending == 0 {
			cancel()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("follow: %v", err)
	}
	if want := "[1-3+7 4-6+4 7-9+1 10-10+0]"; fmt.Sprint(got) != want {
		t.Errorf("batches (first-last+pending): got %v, want %s", got, want)
	}
}

func TestPosition(t *testing.T) {
	ctx := context.Background()
	var p memstore.Position
	if got, err := p.Get(ctx); err != nil || got != 0 {
		t.Errorf("zero value: got %d, %v, want 0", got, err)
	}
	// Set stores what it is given, also below where it was.
	for _, seq := range []uint64{42, 7, 0} {
		if err := p.Set(ctx, seq); err != nil {
			t.Fatalf("set %d: %v", seq, err)
		}
		if got, err := p.Get(ctx); err != nil || got != seq {
			t.Errorf("after set %d: got %d, %v", seq, got, err)
		}
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.Set(gone, 9); !errors.Is(err, context.Canceled) {
		t.Errorf("set with an ended context: got %v, want context.Canceled", err)
	}
	if _, err := p.Get(gone); !errors.Is(err, context.Canceled) {
		t.Errorf("get with an ended context: got %v, want context.Canceled", err)
	}
}

func TestPositionIsSafeForConcurrentUse(t *testing.T) {
	ctx := context.Background()
	var p memstore.Position
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				if err := p.Set(ctx, uint64(i*100+j)); err != nil {
					t.Error(err)
				}
				if _, err := p.Get(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got, _ := p.Get(ctx)
	if got%100 != 99 {
		t.Errorf("after every goroutine's last set: got %d, want one of them (x99)", got)
	}
}
