package bench

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The host probe: a chunk of probeChunk of arithmetic every probeEvery, 1%
// of one core.
const (
	probeChunk = 50 * time.Microsecond
	probeEvery = 5 * time.Millisecond
	// probeSlow is how many times its usual CPU time a chunk must take for
	// the machine to count as running slow meanwhile.
	probeSlow = 5
)

// sink keeps the probe's arithmetic from being optimized away.
var sink atomic.Uint64

// Host says whether the machine under the bench, not the bench, was
// slow during a section. On a virtual machine the host can run a guest's
// processors several times slower for tens of milliseconds (another
// tenant, the host backing the guest's memory), and every latency in that
// window grows with it; the tail of a latency run is only about the
// service when SlowMS is near zero.
type Host struct {
	// Chunks is how many chunks the probe timed; ChunkUS the usual CPU
	// time of one, in microseconds, measured before the section.
	Chunks  int     `json:"chunks"`
	ChunkUS float64 `json:"chunk_us"`
	// SlowChunks took probeSlow times ChunkUS or more; SlowMS estimates
	// the time the machine ran slow (a slow chunk stands for its probeEvery),
	// and Episodes counts runs of consecutive slow chunks.
	SlowChunks int     `json:"slow_chunks"`
	SlowMS     float64 `json:"slow_ms"`
	Episodes   int     `json:"episodes"`
	// WorstX is the slowest chunk, as a multiple of ChunkUS.
	WorstX float64 `json:"worst_x"`
}

var calibration struct {
	once  sync.Once
	iters int
	usual time.Duration
	ok    bool
}

// probeHost starts the host probe; the function it returns stops it and
// says what it saw, or nil where it cannot run.
func probeHost() func() *Host {
	calibration.once.Do(func() {
		calibration.iters, calibration.usual, calibration.ok = calibrate()
	})
	if !calibration.ok || calibration.usual <= 0 {
		return func() *Host { return nil }
	}
	stop := make(chan struct{})
	done := make(chan []time.Duration)
	go func() { done <- probeLoop(stop, calibration.iters) }()
	return func() *Host {
		close(stop)
		return judge(<-done, calibration.usual)
	}
}

// judge turns the chunks' CPU times into a Host against the usual
// time of a chunk.
func judge(ds []time.Duration, usual time.Duration) *Host {
	r := &Host{Chunks: len(ds), ChunkUS: float64(usual.Microseconds())}
	prevSlow := false
	for _, d := range ds {
		x := float64(d) / float64(usual)
		r.WorstX = max(r.WorstX, x)
		slow := x >= probeSlow
		if slow {
			r.SlowChunks++
			if !prevSlow {
				r.Episodes++
			}
		}
		prevSlow = slow
	}
	r.SlowMS = float64(r.SlowChunks) * float64(probeEvery) / float64(time.Millisecond)
	return r
}

// brief is r in a few words for the table's notes.
func (r *Host) brief() string {
	if r == nil {
		return "not probed"
	}
	return fmt.Sprintf("about %.0f ms slow in %d episodes", r.SlowMS, r.Episodes)
}
