// Package pgtest gives tests the PostgreSQL they run against. House rule: SQL
// is tested on a real database, and a CI run without one is a broken setup,
// not a pass.
package pgtest

import (
	"os"
	"testing"
)

// URL is the PostgreSQL URL from TORPOR_TEST_DATABASE_URL. Without it the
// test fails under CI=true (.ci/run starts a PostgreSQL and sets the URL, so
// its absence there is a broken setup) and is skipped elsewhere, loudly.
func URL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("TORPOR_TEST_DATABASE_URL")
	if url != "" {
		return url
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("TORPOR_TEST_DATABASE_URL is not set under CI=true: the SQL tests need a PostgreSQL (.ci/run starts one and sets it)")
	}
	t.Skip("SKIPPING: TORPOR_TEST_DATABASE_URL is not set, so the SQL tests did not run; .ci/run shows how to start a PostgreSQL and set it")
	return ""
}
