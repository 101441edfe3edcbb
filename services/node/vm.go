package node

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/vm"
)

// vmDriver is the vm driver of `torpor driver`: asked for by name, it must
// be able to run here (QEMU, the kernel, busybox), or the verb refuses to
// start (FAILED_PRECONDITION, naming what is missing). torpor serve adds it
// whatever the node has, and refuses each vm create instead.
func vmDriver(cfg DriverConfig, nc *nats.Conn, log zerolog.Logger) (compute.Driver, error) {
	// What the node lacks first: it says more than a missing object store.
	probe, err := vm.New(vm.Config{Data: cfg.Data, NATSURL: cfg.NATSURL, NATSCA: cfg.NATSCA, Binary: cfg.Torpor, Kernel: cfg.VMKernel, Heartbeat: cfg.Heartbeat})
	if err != nil {
		return nil, err
	}
	if err := probe.Missing(); err != nil {
		return nil, err
	}
	// A driver node has a peer (the service that drives it): its
	// suspensions are exported ahead.
	d, err := newVM(nc, 0, cfg.Data, cfg.NATSURL, cfg.NATSCA, cfg.Torpor, cfg.VMKernel, cfg.Heartbeat, true, log)
	if err != nil {
		return nil, err
	}
	if err := d.Missing(); err != nil {
		return nil, err
	}
	return d, nil
}

// newVM is the vm driver over data, its supervisors reporting on url, its
// snapshots moving through the torpor_snapshots object store on nc's
// JetStream: made if missing with replicas copies when replicas is set (the
// service), else bound (a driver node, replicas 0, whose user may not make
// streams). With ahead (a node with peers) each suspension's snapshot is
// exported to the store in the background (vm.Config.ExportAhead).
func newVM(nc *nats.Conn, replicas int, data, url, ca, binary, kernel string, heartbeat time.Duration, ahead bool, log zerolog.Logger) (*vm.Driver, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var store jetstream.ObjectStore
	if replicas > 0 {
		store, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      vm.SnapshotBucket,
			Description: "torpor vm snapshots that move between nodes",
			Storage:     jetstream.FileStorage,
			// Each snapshot is deleted once its guest runs again; the bound
			// is what moving sandboxes may hold at once (reserved at start).
			MaxBytes: 2 << 30,
			Replicas: replicas,
		})
	} else if store, err = js.ObjectStore(ctx, vm.SnapshotBucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, events.Errorf(events.CodeFailedPrecondition, "object store %s: not found; torpor serve makes it (start it first, with the process or vm driver)", vm.SnapshotBucket)
	}
	if err != nil {
		return nil, err
	}
	return vm.New(vm.Config{Data: data, NATSURL: url, NATSCA: ca, Binary: binary, Kernel: kernel, Heartbeat: heartbeat, Snapshots: store, ExportAhead: ahead, Log: log})
}
