package racetest

import (
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

func TestEachReleasesAllAtOnce(t *testing.T) {
	var waiting atomic.Int32
	const n = 8
	errs := Each(n, func(i int) error {
		// Every call is running before any returns: none of them could
		// have been started after another finished.
		waiting.Add(1)
		for waiting.Load() < n {
			runtime.Gosched()
		}
		if i == 3 {
			return errors.New("three")
		}
		return nil
	})
	for i, err := range errs {
		if (err != nil) != (i == 3) {
			t.Fatalf("errs %v", errs)
		}
	}
}

func TestOneWinner(t *testing.T) {
	lost := errors.New("lost")
	for _, tc := range []struct {
		errs   []error
		winner int
		fail   string
	}{
		{[]error{lost, nil, lost}, 1, ""},
		{[]error{nil, lost, nil}, -1, "calls 0 and 2 both succeeded"},
		{[]error{lost, lost}, -1, "no call succeeded"},
		{[]error{nil, errors.New("boom")}, -1, "call 1: boom"},
	} {
		w, err := OneWinner(tc.errs, lost)
		if w != tc.winner || (tc.fail == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.fail)) {
			t.Errorf("OneWinner(%v) = %d, %v; want %d, %q", tc.errs, w, err, tc.winner, tc.fail)
		}
	}
}
