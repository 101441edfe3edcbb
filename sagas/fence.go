package sagas

import (
	"context"

	"github.com/torpor/torpor/events"
)

// fencedRecorder records only while fence says the runner may act.
type fencedRecorder struct {
	Recorder
	fence func() error
}

func (f fencedRecorder) Record(ctx context.Context, cause events.Envelope, actor string, evs ...events.Event) error {
	if err := f.fence(); err != nil {
		return err
	}
	return f.Recorder.Record(ctx, cause, actor, evs...)
}

// fencedPosition saves the position only while fence says the runner may
// act: a runner that lost its lease leaves the position to the next one.
type fencedPosition struct {
	Position
	fence func() error
}

func (f fencedPosition) Set(ctx context.Context, seq uint64) error {
	if err := f.fence(); err != nil {
		return err
	}
	return f.Position.Set(ctx, seq)
}

// fencedTimers changes the record of long timers only while fence says the
// runner may act.
type fencedTimers struct {
	Timers
	fence func() error
}

func (f fencedTimers) Put(ctx context.Context, key string) error {
	if err := f.fence(); err != nil {
		return err
	}
	return f.Timers.Put(ctx, key)
}

func (f fencedTimers) Delete(ctx context.Context, key string) error {
	if err := f.fence(); err != nil {
		return err
	}
	return f.Timers.Delete(ctx, key)
}
