// Package public is the part of an error that a client may read.
//
// An error meant for a client carries its own public text: it has a
// method Public() string, and the HTTP edge (api) writes that text as a
// problem's detail instead of the error's Error text, which is for the
// log. New makes the sentinels of the domain packages: their Error text
// keeps the package's prefix ("lease: epoch not found"), their public
// text is the sentence alone ("epoch not found"). Typed errors (a
// record.StateError, a manifest.LintError) implement Public themselves.
package public

// Error is a sentinel error with a public sentence. Its Error text is
// "pkg: sentence"; compare it with errors.Is, as any sentinel.
type Error struct {
	pkg, sentence string
}

// New returns a sentinel error of package pkg whose public text is
// sentence. An empty pkg makes an error whose Error text is the sentence
// alone.
func New(pkg, sentence string) error {
	return &Error{pkg: pkg, sentence: sentence}
}

// Error returns the text for the log: the package's prefix and the
// sentence.
func (e *Error) Error() string {
	if e.pkg == "" {
		return e.sentence
	}
	return e.pkg + ": " + e.sentence
}

// Public returns the sentence a client may read.
func (e *Error) Public() string { return e.sentence }

// Text returns err's own public text: Public() when err has it. ok is
// false for an error that carries none.
func Text(err error) (text string, ok bool) {
	if p, is := err.(interface{ Public() string }); is {
		return p.Public(), true
	}
	return "", false
}
