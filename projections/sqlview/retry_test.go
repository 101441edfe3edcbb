package sqlview

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/torpor/torpor/projections"
)

// TestSerializationFailureRetried: a transaction that changes the
// checkpoint row while a batch waits for it makes PostgreSQL fail the
// batch's SERIALIZABLE transaction (40001); the batch runs again in a new
// transaction and lands once.
func TestSerializationFailureRetried(t *testing.T) {
	d := newDB(t)
	v := d.view(t, DefaultName, nil)
	envs := envelopes(t, lifecycle(t))
	applyIn(t, v, envs[:5], 5)
	ctx := context.Background()

	other, err := d.admin.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, `UPDATE torpor_checkpoints SET seq = seq WHERE view = $1`, DefaultName); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- v.ApplyBatch(ctx, envs[5:]) }()
	eventually(t, "the batch waiting on the checkpoint row", func() (bool, error) {
		var n int
		err := d.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
			d.schema+"_"+DefaultName).Scan(&n)
		return n > 0, err
	})
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("ApplyBatch: %v", err)
	}
	if v.Retries() == 0 {
		t.Error("Retries = 0: the batch did not meet a serialization failure")
	}

	fresh := newDB(t)
	applyIn(t, fresh.view(t, DefaultName, nil), envs, len(envs))
	sameDump(t, d.dump(t), fresh.dump(t))
	if got, want := v.Applied(), uint64(len(envs)); got != want {
		t.Errorf("Applied = %d, want %d (each event once)", got, want)
	}
}

// TestConcurrentWriters: two writers of one view follow the same log at
// once, in batches of different sizes, so their SERIALIZABLE transactions
// collide on the checkpoint and the rows; the tables end as one writer
// alone leaves them, and no event was folded twice.
func TestConcurrentWriters(t *testing.T) {
	d := newDB(t)
	envs := envelopes(t, randomScript(t, 3, 20, 1200))
	store := logOf(t, envs)
	last := envs[len(envs)-1].Seq

	views := []*View{d.view(t, DefaultName, nil), d.view(t, DefaultName, nil)}
	runners := make([]*projections.Runner, len(views))
	for i, v := range views {
		r, err := projections.NewRunner(store, v, projections.Config{BatchSize: 7 + 6*i, Attempts: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		runners[i] = r
		run(t, r)
	}
	for _, r := range runners {
		eventually(t, "both writers at the head", func() (bool, error) { return r.Position() >= last, nil })
	}
	caughtUp(t, views[0], last)

	fresh := newDB(t)
	alone := fresh.view(t, DefaultName, nil)
	applyIn(t, alone, envs, 100)
	sameDump(t, d.dump(t), fresh.dump(t))
	if got, want := views[0].Applied()+views[1].Applied(), alone.Applied(); got != want {
		t.Errorf("the writers folded %d events, one alone %d: some twice or not at all", got, want)
	}
	t.Logf("retries: %d and %d; applied %d and %d", views[0].Retries(), views[1].Retries(), views[0].Applied(), views[1].Applied())
}
