// Package racetest releases concurrent calls at once, for the tests that
// race callers against each other, and judges races that one caller must
// win.
package racetest

import (
	"errors"
	"fmt"
	"sync"
)

// Together runs each of calls in a goroutine of its own, all released at
// the same moment, and returns when every one has returned.
func Together(calls ...func()) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, call := range calls {
		wg.Go(func() {
			<-start
			call()
		})
	}
	close(start)
	wg.Wait()
}

// Each runs call(0) to call(n-1) Together and returns their errors, by i.
func Each(n int, call func(i int) error) []error {
	errs := make([]error, n)
	calls := make([]func(), n)
	for i := range calls {
		calls[i] = func() { errs[i] = call(i) }
	}
	Together(calls...)
	return errs
}

// OneWinner returns the index of the one nil error of errs. It is an
// error that none or more than one is nil, or that a loser failed other
// than with loser (errors.Is).
func OneWinner(errs []error, loser error) (int, error) {
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			return -1, fmt.Errorf("calls %d and %d both succeeded", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, loser):
			return -1, fmt.Errorf("call %d: %w (want success or %v)", i, err, loser)
		}
	}
	if winner < 0 {
		return -1, errors.New("no call succeeded")
	}
	return winner, nil
}
