package main

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/services/node"
)

// The service is services/node; serve and the tests start it through these.
type (
	serveConfig  = node.Config
	app          = node.Node
	driverConfig = node.DriverConfig
)

// start starts a node of cfg (node.Start).
func start(ctx context.Context, cfg serveConfig, log zerolog.Logger) (*app, error) {
	return node.Start(ctx, cfg, log)
}
