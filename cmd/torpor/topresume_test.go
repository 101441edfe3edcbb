package main

import (
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// TestResumeText: top says a resume's stages in their order, from the
// command accepted, only for the generation the view is at and once its
// attach (ready) is in the history.
func TestResumeText(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	v := events.View{Generation: 3}
	for _, c := range []struct {
		name string
		gen  int64
		st   map[string]time.Duration
		want string
	}{
		{"vm", 3, map[string]time.Duration{"running": ms(240), "restore_started": ms(15), "ready": ms(312)}, "  resume →restore_started 15ms →running 240ms →ready 312ms"},
		{"a driver that says no stage", 3, map[string]time.Duration{"ready": ms(40)}, "  resume →ready 40ms"},
		{"an older resume (a cold start since)", 2, map[string]time.Duration{"ready": ms(40)}, ""},
		{"no attach yet", 3, map[string]time.Duration{"running": ms(240)}, ""},
	} {
		if got := resumeText(c.gen, v, c.st); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
