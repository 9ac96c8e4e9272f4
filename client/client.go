package client

import (
	"context"
	"fmt"
	"mime"
	"net/http"
)

// New returns a client of the authzd serving at baseURL (such as
// "http://127.0.0.1:8080"; the document's paths are appended to it).
//
// Every request carries credential as `Authorization: Bearer`, unless
// credential is empty (the health routes, the JWKS and the document need
// none). Every answer of status 400 or more is returned as a *Problem
// error and no response, except an application/json one: the document
// gives a few refusals a body of their own (a formation denied by policy
// is answered 403 with its record), and those are decoded into the
// response's JSON field for their status, as successful answers are.
//
// opts are applied before New's own settings: WithHTTPClient chooses the
// transport (http.DefaultClient when absent), and request editors added
// with WithRequestEditorFn run before the credential is set.
func New(baseURL, credential string, opts ...ClientOption) (*ClientWithResponses, error) {
	c, err := NewClient(baseURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", baseURL, err)
	}
	if c.Client == nil {
		c.Client = http.DefaultClient
	}
	c.Client = problemDoer{next: c.Client}
	if credential != "" {
		c.RequestEditors = append(c.RequestEditors, bearer(credential))
	}
	return &ClientWithResponses{ClientInterface: c}, nil
}

// bearer sets the Authorization header of every request to credential.
func bearer(credential string) RequestEditorFn {
	return func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+credential)
		return nil
	}
}

// problemDoer sends requests through next and returns an answer of status
// 400 or more that is not application/json as a *Problem error, its body
// read and closed.
type problemDoer struct{ next HttpRequestDoer }

func (d problemDoer) Do(req *http.Request) (*http.Response, error) {
	resp, err := d.next.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 400 {
		return resp, nil
	}
	if media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); media == "application/json" {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, ReadProblem(resp)
}
