package main

import (
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/services/node"
)

// driverCmd is `torpor driver`: it serves this machine's drivers to the
// service on the bus, on torpor.driver.<node>.<op>, until SIGINT or SIGTERM.
func driverCmd() *cobra.Command {
	cfg := node.DriverConfig{}
	cmd := &cobra.Command{
		Use:   "driver --node N --nats-url URL --data DIR [--drivers sim,process]",
		Short: "serve this machine's drivers to the service on the bus (torpor.driver.<node>.<op>)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Info and above: every call at debug would drown the log.
			cfg.SimByDefault = !cmd.Flags().Changed("drivers")
			log := zerolog.New(zerolog.ConsoleWriter{Out: cmd.ErrOrStderr(), TimeFormat: time.TimeOnly}).Level(zerolog.InfoLevel).With().Timestamp().Str("part", "driver").Logger()
			return node.RunDriver(cmd.Context(), cfg, cmd.ErrOrStderr(), log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Node, "node", "", "the node whose drivers this process serves")
	f.StringSliceVar(&cfg.Drivers, "drivers", []string{"sim", "process"}, "the drivers to serve: "+strings.Join(node.DriverNames, ", "))
	f.StringVar(&cfg.NATSURL, "nats-url", "", "the NATS the service runs on")
	f.StringVar(&cfg.NATSCreds, "nats-creds", "", "the NATS credentials file to connect with (`torpor creds --role driver --node N`, with --sim-reports to serve the sim; without, the default --drivers leaves the sim out)")
	f.StringVar(&cfg.NATSCA, "nats-ca", "", "a PEM file of CAs to trust for a NATS server with TLS, besides the system's (its supervisors trust it too)")
	f.StringVar(&cfg.Data, "data", "", "where the drivers keep their sandboxes (the sim's journal, the process sandboxes)")
	f.StringVar(&cfg.VMKernel, "vm-kernel", "", "the guest kernel of the vm driver")
	f.DurationVar(&cfg.Heartbeat, "heartbeat", 5*time.Second, "how often the process driver's supervisors heartbeat (a third of the service's --heartbeat-limit)")
	f.StringVar(&cfg.RunAs, runAsFlag, "", runAsUsage)
	return cmd
}
