package main

import (
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/services/compute/process"
)

// superviseCmd is `torpor supervise`: it runs a workload for its driver and
// reports on it (process.Supervise). The credential comes from the
// environment; the rest of the environment is the workload's.
func superviseCmd() *cobra.Command {
	s := process.Supervision{}
	var readyFD int
	cmd := &cobra.Command{
		Use:   "supervise --sandbox ID --generation N --nats-url URL [--dir DIR] -- CMD…",
		Short: "run a sandbox's workload and report on it as its generation (started by the process driver)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s.Command = args
			s.Credential = os.Getenv(process.CredentialEnv)
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, process.CredentialEnv+"=") {
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
	f.StringVar(&s.Dir, "dir", "", "the sandbox's directory (the process driver's layout); empty: the current directory, and nothing recorded")
	f.DurationVar(&s.Heartbeat, "heartbeat", 5*time.Second, "how often to heartbeat")
	f.StringVar(&s.Freezer, "freezer", "", "how the driver freezes the workload: "+strings.Join(process.Freezers(), ", "))
	f.StringVar(&s.Cgroup, "cgroup", "", "the cgroup directory the workload starts in")
	f.IntVar(&readyFD, "ready-fd", 0, "a file descriptor to say on whether the workload runs")
	_ = f.MarkHidden("ready-fd")
	return cmd
}

// superviseExecCmd is the hidden entry through which a supervisor starts its
// workload (process.Exec): it never returns when the command executes.
func superviseExecCmd() *cobra.Command {
	var cgroup string
	cmd := &cobra.Command{
		Use:    process.ExecVerb + " [--cgroup DIR] -- CMD…",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return process.Exec(cgroup, args)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVar(&cgroup, "cgroup", "", "the cgroup to join first")
	return cmd
}
