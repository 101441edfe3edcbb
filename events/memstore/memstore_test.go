package memstore_test

import (
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/memstore"
	"github.com/torpor/torpor/events/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) events.Store { return memstore.New() })
}
