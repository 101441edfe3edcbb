package gateway

// fifoLock is a mutex that hands itself to the goroutines waiting for it in
// the order they came. A sandbox's lock is taken by commands, saga records
// and supervisor reports; with sync.Mutex the goroutine that just unlocked
// usually takes it again at once (it is running, the waiter is not). The
// resume saga records the consumption and then its outcome, and the
// supervisor's attach report, which makes the sandbox ready, used to wait
// behind both appends instead of one: under load that was one more append
// round trip on the way to ready. FIFO hand-off takes it off (the README,
// Performance, says where a resume's time to ready goes).
//
// It is a channel of capacity one: Lock sends, Unlock receives, and the
// runtime queues blocked senders in order and passes the slot to the first.
type fifoLock chan struct{}

func newFIFOLock() fifoLock { return make(fifoLock, 1) }

func (l fifoLock) Lock() { l <- struct{}{} }

func (l fifoLock) Unlock() { <-l }
