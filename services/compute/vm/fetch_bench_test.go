package vm

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
)

// benchSnapshot lays out in dir a suspension like a 128 MiB guest's that
// has run a while: an eighth of its RAM blocks hold data (half of each
// block random, half zero), and its device state.
func benchSnapshot(b *testing.B, dir string) *suspension {
	b.Helper()
	s := &suspension{Ref: "vm:n1:bench:snap-1-x:" + string(make([]byte, 0)), Held: true, State: "snap-1-bench.state", RAM: "ram-1"}
	r := rand.New(rand.NewPCG(1, 2))
	state := make([]byte, 60<<10)
	for i := range state {
		state[i] = byte(r.IntN(4))
	}
	if err := os.WriteFile(filepath.Join(dir, s.State), state, 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, s.RAM))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(128 << 20); err != nil {
		b.Fatal(err)
	}
	block := make([]byte, blockSize)
	for off := int64(0); off < 128<<20; off += 8 * blockSize {
		for i := range blockSize / 2 {
			block[i] = byte(r.Uint32())
		}
		if _, err := f.WriteAt(block, off); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// BenchmarkFetch is a resume's fetch of a movable snapshot from the object
// store into the node's files (the RAM file, the device state).
func BenchmarkFetch(b *testing.B) {
	g := drivertest.NewGateway(b)
	store, err := g.JS.CreateOrUpdateObjectStore(context.Background(), jetstream.ObjectStoreConfig{Bucket: SnapshotBucket})
	if err != nil {
		b.Fatal(err)
	}
	d := &Driver{cfg: Config{Snapshots: store}}
	src := b.TempDir()
	s := benchSnapshot(b, src)
	e := d.startExport("bench", src, s, 0)
	<-e.done
	if e.err != nil {
		b.Fatal(e.err)
	}
	o, _ := parseObjectRef(e.via)
	b.ReportMetric(float64(e.bytes), "object-bytes")
	b.ReportMetric(float64(e.took.Milliseconds()), "export-ms")
	b.ResetTimer()
	for i := range b.N {
		dst := b.TempDir()
		if _, err := d.fetch(context.Background(), dst, nil, compute.Resume{Generation: int64(i + 2)}, o); err != nil {
			b.Fatal(err)
		}
	}
}
