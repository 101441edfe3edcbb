//go:build !unix

package main

import (
	"errors"
	"time"
)

// processCPU is not read here: the bench's CPU figures stay zero.
func processCPU() (time.Duration, error) {
	return 0, errors.ErrUnsupported
}
