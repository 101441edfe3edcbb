package main

import (
	"flag"
	"io"
	"testing"

	"github.com/torpor/torpor/bench"
)

var heapProfile = flag.String("heapprofile", "", "BenchmarkHeapPerIdleSandbox: write the live heap's profile at each fleet size to FILE.<size>")

// BenchmarkHeapPerIdleSandbox is the growth section's heap per idle sandbox
// (the target of `torpor bench`, issue 28) alone, over the bench's smallest
// and largest fleet: about a minute, where the whole bench takes half an
// hour. go test -run XXX -bench HeapPerIdleSandbox -benchtime 1x ./cmd/torpor
// [-args -heapprofile FILE], then go tool pprof -base FILE.1000 FILE.100000.
func BenchmarkHeapPerIdleSandbox(b *testing.B) {
	cfg := bench.Config{Sandboxes: 1000, Concurrency: 64, Transport: "bus", Duration: 1, Runs: 1,
		Sizes: []int{1000, 100_000}, HeapProfile: *heapProfile}
	for b.Loop() {
		g, _, err := bench.RunGrowth(b.Context(), cfg, benchStart, io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(g.HeapPerSandboxBytes, "B/idle-sandbox")
	}
}
