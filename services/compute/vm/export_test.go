package vm

// SetAfterCont sets the hook a test uses to kill a restored guest right
// after it was continued.
func SetAfterCont(c *Config, f func(pid int)) { c.afterCont = f }
