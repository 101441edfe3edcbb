package jsstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
)

func TestReplay(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	// 2500 events over two sandboxes: more than two chunks.
	var all []events.Envelope
	last := map[string]uint64{}
	for b := range 25 {
		id := []string{"0193b0a4-0000-7000-8000-000000000001", "0193b0a4-0000-7000-8000-000000000002"}[b%2]
		var envs []events.Envelope
		for i := range 100 {
			envs = append(envs, envelope(t, id, int64(b*100+i)))
		}
		seq, err := s.Append(ctx, id, last[id], envs...)
		if err != nil {
			t.Fatalf("append: %v", err)
		}
		last[id] = seq
		for i := range envs {
			envs[i].Seq = seq - uint64(len(envs)-1-i)
		}
		all = append(all, envs...)
	}
	head := all[len(all)-1].Seq

	tests := []struct {
		name string
		from uint64
		want []events.Envelope
	}{
		{"from the start", 0, all},
		{"from sequence 1", 1, all},
		{"from the middle", all[1234].Seq, all[1234:]},
		{"from the last", head, all[len(all)-1:]},
		{"beyond the last", head + 1, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []events.Envelope
			chunks := 0
			upTo, err := s.Replay(ctx, tc.from, func(envs []events.Envelope) error {
				if len(envs) == 0 || len(envs) > jsstore.ReplayChunk {
					t.Errorf("chunk of %d envelopes, want 1 to %d", len(envs), jsstore.ReplayChunk)
				}
				chunks++
				got = append(got, envs...)
				return nil
			})
			if err != nil || upTo != head {
				t.Fatalf("Replay = %d, %v; want %d", upTo, err, head)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("replayed %d events, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if got[i].ID != tc.want[i].ID || got[i].Seq != tc.want[i].Seq || got[i].MsgID != tc.want[i].ID {
					t.Fatalf("event %d: got %s at %d (msg id %s), want %s at %d",
						i, got[i].ID, got[i].Seq, got[i].MsgID, tc.want[i].ID, tc.want[i].Seq)
				}
			}
			if wantChunks := (len(tc.want) + jsstore.ReplayChunk - 1) / jsstore.ReplayChunk; chunks != wantChunks {
				t.Errorf("%d chunks, want %d", chunks, wantChunks)
			}
		})
	}
}

func TestReplayStopsAtTheLastSequenceOfTheCall(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	first, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", 0, envelope(t, "0193b0a4-0000-7000-8000-000000000001", 1))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	upTo, err := s.Replay(ctx, 0, func(envs []events.Envelope) error {
		n += len(envs)
		// An event appended during the replay is not part of it.
		_, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", first, envelope(t, "0193b0a4-0000-7000-8000-000000000001", 2))
		return err
	})
	if err != nil || upTo != first || n != 1 {
		t.Errorf("Replay = %d, %v with %d events; want %d with 1", upTo, err, n, first)
	}
}

func TestReplayReturnsHandlerError(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	if _, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", 0, envelope(t, "0193b0a4-0000-7000-8000-000000000001", 1)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := s.Replay(ctx, 0, func([]events.Envelope) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Replay = %v, want the handler's error", err)
	}
}
