package sagas

// WarmLive is how many goroutines r's warm pool holds, for sagas_test to
// check that none outlives Run.
func WarmLive(r *Runner) int { return r.warm.Live() }
