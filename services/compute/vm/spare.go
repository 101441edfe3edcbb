package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"github.com/torpor/torpor/services/compute/supervisor"
)

// Job is what a spare supervisor (`torpor supervise --vm --job-fd`) is
// given to do: the Supervision's fields that name a sandbox's generation.
// The credentials come in it, never on a command line.
type Job struct {
	Sandbox    string `json:"sandbox"`
	Generation int64  `json:"generation"`
	Dir        string `json:"dir"`
	Restore    bool   `json:"restore,omitempty"`
	Credential string `json:"credential"`
	BusCreds   string `json:"bus_creds,omitempty"`
}

// Apply sets s's fields from j.
func (j Job) Apply(s *Supervision) {
	s.Sandbox, s.Generation, s.Dir, s.Restore, s.Credential, s.BusCreds = j.Sandbox, j.Generation, j.Dir, j.Restore, j.Credential, j.BusCreds
}

// spareLog is where spare supervisors write until they have a job, in the
// driver's directory.
const spareLog = ".spare.log"

// errNoSpare: no spare supervisor was there (or it had ended before it
// took its job); the caller starts one afresh.
var errNoSpare = errors.New("no spare supervisor")

// giveSpare hands j to the spare supervisor, if one waits: the start or
// restore then saves a supervisor's start. One spare waits at a time (a
// process of about 10 MB, on a node that runs VMs); refillSpare starts the
// next after each start or restore.
func (d *Driver) giveSpare(ctx context.Context, j Job) (supervisor.Proc, error) {
	d.spareMu.Lock()
	sp := d.spare
	d.spare = nil
	d.spareMu.Unlock()
	if sp == nil {
		return supervisor.Proc{}, errNoSpare
	}
	sup, why, err := sp.Give(ctx, j, filepath.Join(j.Dir, logFile))
	switch {
	case errors.Is(err, supervisor.ErrSpareGone):
		return supervisor.Proc{}, errNoSpare
	case err == nil && why != "":
		err = errors.New(why)
	}
	return sup, err
}

// refillSpare starts a spare supervisor unless one waits. A spare that
// cannot start is no failure: the next start or restore starts its own.
func (d *Driver) refillSpare() {
	d.spareMu.Lock()
	defer d.spareMu.Unlock()
	if d.spare != nil && d.spare.Proc.Alive() {
		return
	}
	args := []string{d.cfg.Binary, "supervise", "--vm",
		"--nats-url", d.cfg.NATSURL,
		"--nats-ca", d.cfg.NATSCA,
		"--heartbeat", d.cfg.Heartbeat.String(),
		"--ready-fd", strconv.Itoa(supervisor.ReadyFD),
		"--job-fd", strconv.Itoa(supervisor.JobFD),
	}
	sp, err := supervisor.StartSpare(args, []string{"PATH=" + os.Getenv("PATH")}, d.root, filepath.Join(d.root, spareLog))
	if err != nil {
		d.spare = nil
		return
	}
	d.spare = sp
}

// Close lets the spare supervisor go (it exits). A driver that ends
// without Close lets it go all the same: its job pipe closes with the
// driver's process.
func (d *Driver) Close() {
	d.spareMu.Lock()
	defer d.spareMu.Unlock()
	if d.spare != nil {
		d.spare.Close()
		d.spare = nil
	}
}

// SupervisorLog is the name of the supervisor's log in a sandbox's
// directory (where a spare writes once it has its job).
const SupervisorLog = logFile
