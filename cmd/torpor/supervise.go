package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/services/compute/process"
	"github.com/torpor/torpor/services/compute/supervisor"
	"github.com/torpor/torpor/services/compute/vm"
)

// superviseCmd is `torpor supervise`: it runs a workload for its driver and
// reports on it (process.Supervise). The credential comes from the
// environment; the rest of the environment is the workload's.
func superviseCmd() *cobra.Command {
	s := process.Supervision{}
	var readyFD, jobFD int
	var isVM, restore bool
	var natsCreds string
	cmd := &cobra.Command{
		Use:   "supervise --sandbox ID --generation N --nats-url URL [--dir DIR] (-- CMD… | --vm [--restore])",
		Short: "run a sandbox's workload (a process group, or a VM's QEMU) and report on it as its generation (started by its driver)",
		RunE: func(cmd *cobra.Command, args []string) error {
			if isVM {
				var err error
				if s.BusCreds, err = busCreds(natsCreds); err != nil {
					return invalid(err)
				}
				return superviseVM(cmd, s, readyFD, jobFD, restore, args)
			}
			if len(args) == 0 {
				return invalid(errors.New("supervise: no command"))
			}
			s.Command = args
			s.Credential = os.Getenv(process.CredentialEnv)
			var err error
			if s.BusCreds, err = busCreds(natsCreds); err != nil {
				return invalid(err)
			}
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, process.CredentialEnv+"=") && !strings.HasPrefix(kv, supervisor.BusCredsEnv+"=") {
					s.Env = append(s.Env, kv)
				}
			}
			if readyFD > 0 {
				s.Ready = os.NewFile(uintptr(readyFD), "ready")
			}
			if err := s.Validate(); err != nil {
				return invalid(err)
			}
			log := zerolog.New(os.Stderr).With().Timestamp().Str("part", "supervise").Logger()
			return process.Supervise(cmd.Context(), s, log)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // what follows the first argument is the command's
	f.StringVar(&s.Sandbox, "sandbox", "", "the sandbox's id")
	f.Int64Var(&s.Generation, "generation", 0, "the generation to attach as")
	f.StringVar(&s.NATSURL, "nats-url", "", "the NATS server to report on")
	f.StringVar(&s.NATSCA, "nats-ca", "", "a PEM file of CAs to trust for a NATS server with TLS (besides the system's)")
	f.StringVar(&natsCreds, "nats-creds", "", "a NATS credentials file to connect with; default: the text in $"+supervisor.BusCredsEnv+" (what the driver passes)")
	f.StringVar(&s.Dir, "dir", "", "the sandbox's directory (the process driver's layout); empty: the current directory, and nothing recorded")
	f.DurationVar(&s.Heartbeat, "heartbeat", 5*time.Second, "how often to heartbeat")
	f.StringVar(&s.Freezer, "freezer", "", "how the driver freezes the workload: "+strings.Join(process.Freezers(), ", "))
	f.StringVar(&s.Cgroup, "cgroup", "", "the cgroup directory the workload starts in")
	f.StringVar(&s.RunAs, "run-as", "", "the user the workload runs as (a name, uid or uid:gid); default the supervisor's")
	f.IntVar(&readyFD, "ready-fd", 0, "a file descriptor to say on whether the workload runs")
	_ = f.MarkHidden("ready-fd")
	f.IntVar(&jobFD, "job-fd", 0, "with --vm: start ahead, and read the job (sandbox, generation, directory, credentials) from this file descriptor")
	_ = f.MarkHidden("job-fd")
	f.BoolVar(&isVM, "vm", false, "supervise the QEMU of the vm driver's sandbox in --dir (no command)")
	f.BoolVar(&restore, "restore", false, "with --vm: QEMU waits for the driver's snapshot, and the supervisor attaches once the guest runs")
	return cmd
}

// superviseVM is `torpor supervise --vm`: vm.Supervise over the flags that
// the process supervisor shares with it.
//
// With jobFD, it is a spare, started by its driver ahead of its job: it
// waits for the job on jobFD (vm.Job), then writes to the sandbox's
// supervisor.log and runs as one started with those flags would. Its
// job pipe closed without a job (its driver let it go or ended), it exits.
func superviseVM(cmd *cobra.Command, p process.Supervision, readyFD, jobFD int, restore bool, args []string) error {
	if len(args) > 0 {
		return invalid(errors.New("supervise --vm: the guest's command is in its image, not on this command line"))
	}
	s := vm.Supervision{Sandbox: p.Sandbox, Generation: p.Generation, Credential: os.Getenv(supervisor.CredentialEnv),
		NATSURL: p.NATSURL, NATSCA: p.NATSCA, BusCreds: p.BusCreds, Dir: p.Dir, Heartbeat: p.Heartbeat, Restore: restore}
	if jobFD > 0 {
		var j vm.Job
		if err := supervisor.ReadJob(jobFD, &j); supervisor.NoJob(err) {
			return nil
		} else if err != nil {
			return invalid(err)
		}
		j.Apply(&s)
		if err := logTo(filepath.Join(j.Dir, vm.SupervisorLog)); err != nil {
			return err
		}
	}
	if readyFD > 0 {
		s.Ready = os.NewFile(uintptr(readyFD), "ready")
	}
	if err := s.Validate(); err != nil {
		return invalid(err)
	}
	log := zerolog.New(os.Stderr).With().Timestamp().Str("part", "supervise").Logger()
	return vm.Supervise(cmd.Context(), s, log)
}

// superviseExecCmd is the hidden entry through which a supervisor starts its
// workload (process.Exec): it never returns when the command executes.
func superviseExecCmd() *cobra.Command {
	var cgroup, runAs string
	cmd := &cobra.Command{
		Use:    process.ExecVerb + " [--cgroup DIR] [--run-as USER] -- CMD…",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return process.Exec(cgroup, runAs, args)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVar(&cgroup, "cgroup", "", "the cgroup to join first")
	cmd.Flags().StringVar(&runAs, "run-as", "", "the user to become then (a name, uid or uid:gid)")
	return cmd
}

// busCreds is the supervisor's NATS credentials: the file --nats-creds
// names, else what its driver put in its environment.
func busCreds(file string) (string, error) {
	if file == "" {
		return os.Getenv(supervisor.BusCredsEnv), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--nats-creds: %w", err)
	}
	return string(b), nil
}

// logTo points this process's stdout and stderr (its log, and its
// children's stderr) at the file at path, appended to.
func logTo(path string) error {
	f, err := supervisor.OpenAppend(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, fd := range []int{1, 2} {
		if err := syscall.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("log to %s: %w", path, err)
		}
	}
	return nil
}
