//go:build race

package transport_test

// raceEnabled: the race detector roughly multiplies the memory a goroutine
// costs, which bounds on RSS must allow for.
const raceEnabled = true
