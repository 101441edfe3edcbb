package kvview

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Asynchronous persistence (Config.AsyncPersist). The view is derived: the
// log is the truth, and the view can be folded from it again. So the view's
// bucket need not pay for an fsync per write, which the server's
// sync_always (serve --fsync always) otherwise costs every stream. With
// JetStream's per-stream persist mode "async" the server buffers the
// bucket's writes in its memory and writes them out a few milliseconds
// later, syncing them with its sync interval; a crash of the whole process
// (serve with its embedded server) loses the writes not written out yet,
// and a crash of the machine those not synced yet.
//
// The checkpoint must never be ahead of what it covers. It stays in the
// positions bucket, which keeps the server's persistence (synced with
// --fsync always), and with an async bucket it carries a stamp: the last
// sequence of the bucket's stream when it was written, after the views it
// covers were acknowledged, so at or above each of theirs. The server
// writes a stream's messages out in order and, at a restart, recovers the
// longest undamaged prefix of them (an async stream is allowed to come back
// with a lower last sequence), so a view stream that lost writes comes back
// with a last sequence below the stamp of any checkpoint written after
// them. New, before the view is shared, compares the two: a stamp above the
// stream's last sequence (or views with no checkpoint at all) means the
// bucket may have lost writes the checkpoint covers, and the checkpoint is
// set back to 0 (stamped with the stream's last sequence, so the next start
// does not take the old one up again): the runner folds the whole log in
// again, which the writer does idempotently (a view at or past an event's
// seq skips it, a view that lost writes takes the events it lost), and
// /readyz says the view lags meanwhile. A checkpoint that lost writes
// itself is only behind, and that is always safe.
//
// The reset is written before anything else writes the bucket, so the
// stream cannot grow past the stale stamp before it is compared: the
// caller must not write the bucket through another View before New
// returns. Only the embedded server's buckets of one replica may be async
// (the server refuses the mode on replicated streams, and a server of its
// own can crash while this process runs on); services/node decides.

// checkpointValue is what the checkpoint key holds: seq in decimal, and
// with an async bucket a space and the stamp.
func checkpointValue(seq, stamp uint64, async bool) []byte {
	b := strconv.AppendUint(nil, seq, 10)
	if async {
		b = append(b, ' ')
		b = strconv.AppendUint(b, stamp, 10)
	}
	return b
}

// parseCheckpoint reads a checkpoint key's value: seq, and the stamp (0
// when there is none).
func parseCheckpoint(s string) (seq, stamp uint64, err error) {
	a, b, stamped := strings.Cut(s, " ")
	if seq, err = strconv.ParseUint(a, 10, 64); err != nil {
		return 0, 0, err
	}
	if stamped {
		if stamp, err = strconv.ParseUint(b, 10, 64); err != nil {
			return 0, 0, err
		}
	}
	return seq, stamp, nil
}

// openBucket creates the bucket kc, or binds to it when it exists, as
// CreateOrUpdateKeyValue does, but with the persist mode async when async
// is asked and the bucket is new. A bucket keeps the mode it was made with
// (the server refuses to change it), so an existing bucket is updated with
// its own; the answer says which mode it has.
func openBucket(ctx context.Context, js jetstream.JetStream, kc jetstream.KeyValueConfig, async bool) (jetstream.KeyValue, bool, error) {
	s, err := js.Stream(ctx, "KV_"+kc.Bucket)
	switch {
	case err == nil:
		async = s.CachedInfo().Config.PersistMode == jetstream.AsyncPersistMode
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, false, err
	}
	if !async {
		kv, err := js.CreateOrUpdateKeyValue(ctx, kc)
		return kv, false, err
	}
	sc := kvStreamConfig(kc)
	sc.PersistMode = jetstream.AsyncPersistMode
	if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
		return nil, false, err
	}
	kv, err := js.KeyValue(ctx, kc.Bucket)
	return kv, true, err
}

// kvStreamConfig is the stream config nats.go's CreateKeyValue makes of kc
// (jetstream's prepareKeyValueConfig, v1.55.0), for the fields the view
// sets: the KV API binds to the stream as to any bucket.
func kvStreamConfig(kc jetstream.KeyValueConfig) jetstream.StreamConfig {
	history := int64(max(kc.History, 1))
	maxBytes, maxValue := kc.MaxBytes, kc.MaxValueSize
	if maxBytes == 0 {
		maxBytes = -1
	}
	if maxValue == 0 {
		maxValue = -1
	}
	dupes := 2 * time.Minute
	if kc.TTL > 0 && kc.TTL < dupes {
		dupes = kc.TTL
	}
	return jetstream.StreamConfig{
		Name:              "KV_" + kc.Bucket,
		Description:       kc.Description,
		Subjects:          []string{"$KV." + kc.Bucket + ".>"},
		MaxMsgsPerSubject: history,
		MaxBytes:          maxBytes,
		MaxAge:            kc.TTL,
		MaxMsgSize:        maxValue,
		Storage:           kc.Storage,
		Replicas:          max(kc.Replicas, 1),
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        dupes,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		AllowDirect:       true,
		Discard:           jetstream.DiscardNew,
	}
}

// lastSeq is the last sequence of the bucket's stream.
func (v *View) lastSeq(ctx context.Context) (uint64, error) {
	s, err := v.js.Stream(ctx, "KV_"+v.cfg.Bucket)
	if err != nil {
		return 0, fmt.Errorf("stream of %s: %w", v.cfg.Bucket, err)
	}
	return s.CachedInfo().State.LastSeq, nil
}

// recover sets the checkpoint of an async bucket back to 0 when the bucket
// may have lost writes it covers (see above), and says so in Recovered. v
// is not shared yet.
func (v *View) recover(ctx context.Context) error {
	last, err := v.lastSeq(ctx)
	if err != nil {
		return err
	}
	cp, err := v.readCheckpoint(ctx)
	if err != nil {
		return err
	}
	v.cp = cp
	switch {
	case cp.rev == 0 && last == 0: // a new bucket
		return nil
	case cp.rev != 0 && cp.stamp <= last && (cp.stamp != 0 || cp.seq == 0):
		return nil // every write the checkpoint covers is there
	case cp.rev == 0:
		v.recovered = fmt.Sprintf("views (stream at %d) and no checkpoint", last)
	default:
		v.recovered = fmt.Sprintf("checkpoint %d stamped %d, stream at %d", cp.seq, cp.stamp, last)
	}
	val := checkpointValue(0, last, true)
	var rev uint64
	if cp.rev == 0 {
		rev, err = v.pos.Create(ctx, v.cpKey, val)
	} else {
		rev, err = v.pos.Update(ctx, v.cpKey, val, cp.rev)
	}
	if err != nil {
		return fmt.Errorf("set checkpoint %s back to 0: %w", v.cpKey, err)
	}
	v.cp = checkpoint{loaded: true, seq: 0, stamp: last, rev: rev}
	return nil
}

// Async reports whether the bucket has asynchronous persistence.
func (v *View) Async() bool { return v.async }

// Recovered says, when New found that the bucket may have lost writes its
// checkpoint covered and set the checkpoint back to 0, what it found; empty
// otherwise.
func (v *View) Recovered() string { return v.recovered }
