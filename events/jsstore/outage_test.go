package jsstore

import (
	"testing"
	"time"
)

// TestOutagesWithin: the time the log was unavailable since a moment counts
// each window once where they overlap, cuts them at since and now, and
// counts the connection down and an operation in flight past slowOp as
// outages under way.
func TestOutagesWithin(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	cases := []struct {
		name  string
		setup func(o *outages)
		since float64
		now   float64
		want  time.Duration
	}{
		{"none", func(o *outages) {}, 0, 10, 0},
		{"one inside", func(o *outages) { o.mark(at(2), at(5)) }, 0, 10, 3 * time.Second},
		{"cut at since", func(o *outages) { o.mark(at(2), at(5)) }, 4, 10, time.Second},
		{"cut at now", func(o *outages) { o.mark(at(2), at(5)) }, 0, 3, time.Second},
		{"before since", func(o *outages) { o.mark(at(1), at(2)) }, 3, 10, 0},
		{"overlapping, counted once", func(o *outages) { o.mark(at(2), at(5)); o.mark(at(4), at(6)) }, 0, 10, 4 * time.Second},
		{"apart", func(o *outages) { o.mark(at(1), at(2)); o.mark(at(4), at(6)) }, 0, 10, 3 * time.Second},
		{"the connection down since", func(o *outages) { o.disconnected(at(7)) }, 0, 10, 3 * time.Second},
		{"down and back", func(o *outages) { o.disconnected(at(1)); o.reconnected(at(3)) }, 0, 10, 2 * time.Second},
		{"in flight past slowOp", func(o *outages) { o.begin(at(6)) }, 0, 10, 4 * time.Second},
		{"in flight, not slow yet", func(o *outages) { o.begin(at(9.5)) }, 0, 10, 0},
		{"a slow op ended", func(o *outages) { o.end(o.begin(at(1)), at(4), false) }, 0, 10, 3 * time.Second},
		{"a quick op ended well", func(o *outages) { o.end(o.begin(at(1)), at(1.5), false) }, 0, 10, 0},
		{"a quick op that failed", func(o *outages) { o.end(o.begin(at(1)), at(1.5), true) }, 0, 10, 500 * time.Millisecond},
		{"in flight inside a window", func(o *outages) { o.mark(at(2), at(8)); o.begin(at(3)) }, 0, 10, 8 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := newOutages()
			c.setup(o)
			if got := o.within(at(c.since), at(c.now)); got != c.want {
				t.Errorf("within(%v, %v) = %v, want %v", c.since, c.now, got, c.want)
			}
		})
	}
}
