package sagas_test

import (
	"fmt"

	"github.com/torpor/torpor/sagas"
)

// Each node's sagas keep their place in the log under a key of their own.
func ExamplePositionKey() {
	fmt.Println(sagas.PositionKey("local"))
	fmt.Println(sagas.PositionKey("rack-2"))
	// Output:
	// sagas.local
	// sagas.rack-2
}
