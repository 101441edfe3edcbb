package warm

import (
	"encoding/json"
	"sync"
	"testing"
	"time"
)

// BenchmarkGo and BenchmarkWarm run the same tasks, on a goroutine started
// for each (go f()) and on the pool: what the pool saves is the difference.
// Each task is run and waited for, one at a time ("serial"), or by 64
// callers at once ("parallel", as the bench's clients drive the service).
// BenchmarkInline runs them on the benchmark's goroutine: the floor, the
// task's own cost, that neither can go below. The tasks:
//   - empty: nothing; the cost of the hand-off alone;
//   - json: a view-sized struct encoded and decoded a few frames down, as a
//     bus command's reply or a saga's record is; it needs little stack;
//   - json32k: the same at the bottom of about 32 KiB of stack, as deep as
//     a NATS request and a zerolog line take a step (the pool keeps such a
//     stack grown; the garbage collector may shrink an idle one again).
func BenchmarkGo(b *testing.B) {
	benchTasks(b, func(f func()) { go f() })
}

func BenchmarkWarm(b *testing.B) {
	p := New(time.Second)
	b.Cleanup(p.Close)
	benchTasks(b, p.Go)
}

func BenchmarkInline(b *testing.B) {
	for _, tc := range tasks {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tc.f()
			}
		})
	}
}

var tasks = []struct {
	name string
	f    func()
}{
	{"empty", func() {}},
	{"json", func() { encodeDown(3) }},
	{"json32k", func() { deep(128) }},
}

func benchTasks(b *testing.B, run func(func())) {
	for _, tc := range tasks {
		b.Run(tc.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			done := make(chan struct{})
			task := func() { tc.f(); done <- struct{}{} }
			for b.Loop() {
				run(task)
				<-done
			}
		})
		b.Run(tc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(32) // 64 callers on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				var wg sync.WaitGroup
				task := func() { tc.f(); wg.Done() }
				for pb.Next() {
					wg.Add(1)
					run(task)
					wg.Wait()
				}
			})
		})
	}
}

// view has the shape of events.View (which internal may not import): the
// body of a bus command's reply.
type view struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Phase      string            `json:"phase"`
	Generation int64             `json:"generation"`
	Driver     string            `json:"driver"`
	Node       string            `json:"node"`
	Labels     map[string]string `json:"labels"`
	Restore    struct {
		Held     bool `json:"held"`
		Consumed bool `json:"consumed"`
	} `json:"restore"`
	LastOutcome string    `json:"last_outcome"`
	ExitCode    *int      `json:"exit_code"`
	Reason      string    `json:"reason"`
	UpdatedAt   time.Time `json:"updated_at"`
	Seq         uint64    `json:"seq"`
}

var sample = view{
	ID: "0196c1a8-7d3e-7b41-9f0e-2b8c4d5e6f70", Name: "demo", Phase: "ready", Generation: 2,
	Driver: "sim", Node: "local", Labels: map[string]string{"team": "a", "env": "dev"},
	LastOutcome: "restored", UpdatedAt: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), Seq: 4711,
}

// encodeDown encodes sample and decodes it back, n frames down.
//
//go:noinline
func encodeDown(n int) {
	if n > 0 {
		encodeDown(n - 1)
		return
	}
	data, err := json.Marshal(sample)
	if err != nil {
		panic(err)
	}
	var v view
	if err := json.Unmarshal(data, &v); err != nil {
		panic(err)
	}
}

// deep calls itself n times, each frame holding 256 bytes of locals that
// stay live across the call, so that n = 128 needs about 32 KiB of stack,
// then runs encodeDown at the bottom.
//
//go:noinline
func deep(n int) byte {
	var buf [256]byte
	buf[n%len(buf)] = byte(n)
	if n == 0 {
		encodeDown(3)
		return buf[0]
	}
	return deep(n-1) + buf[(n*7)%len(buf)]
}
