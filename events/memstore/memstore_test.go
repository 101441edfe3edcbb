package memstore_test

import (
	"context"
	"fmt"
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
		env := storetest.NewEnvelope(t, "0193b0a4-0000-7000-8000-000000000001", &events.Started{Generation: int64(i)})
		var err error
		if last, err = s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", last, env); err != nil {
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
