package lease

import (
	"context"
	"fmt"
	"sort"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RegisterCertificate stores a verified certificate under its source epoch
// and tool. Registering the same certificate again returns the stored
// record with created false. Checking that the epochs exist and fit is
// the caller's (authz) job.
func (s *Store) RegisterCertificate(ctx context.Context, sc *manifest.SignedCertificate) (*record.Certificate, bool, error) {
	c := sc.Certificate
	rec := &record.Certificate{ID: sc.ID, Certificate: c, KeyID: sc.KeyID, JWS: sc.JWS, RegisteredAt: s.now().UTC()}
	val, err := encodeStored("certificate", toStoredCertificate(rec))
	if err != nil {
		return nil, false, err
	}
	key := s.k.certificate(c.Source, c.Tool, sc.ID)
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, val), clientv3.OpPut(s.k.certificateIndex(sc.ID), key)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return nil, false, s.wrap(ctx, "register certificate", err)
	}
	if resp.Succeeded {
		rec.Revision = resp.Header.Revision
		return rec, true, nil
	}
	old, err := decodeCertificate(resp.Responses[0].GetResponseRange().Kvs[0])
	return old, false, err
}

func decodeCertificate(kv *mvccpb.KeyValue) (*record.Certificate, error) {
	var rec storedCertificate
	if err := decodeStored(kv.Key, kv.Value, &rec); err != nil {
		return nil, err
	}
	if rec.Certificate == nil {
		return nil, fmt.Errorf("%w: %s: no certificate", record.ErrCorrupt, kv.Key)
	}
	return rec.certificate(kv.ModRevision), nil
}

// GetCertificate returns a registered certificate, revoked or not, with
// the revision that last wrote it.
func (s *Store) GetCertificate(ctx context.Context, id string) (*record.Certificate, error) {
	rec, _, err := s.getCertificate(ctx, id)
	return rec, err
}

// getCertificate reads a certificate through its id index and returns the
// record and its key.
func (s *Store) getCertificate(ctx context.Context, id string) (*record.Certificate, string, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	idx, err := s.cli.Get(octx, s.k.certificateIndex(id))
	if err != nil {
		return nil, "", s.wrap(ctx, "get certificate", err)
	}
	if len(idx.Kvs) == 0 {
		return nil, "", fmt.Errorf("%w: %s", record.ErrCertificateNotFound, id)
	}
	key := string(idx.Kvs[0].Value)
	got, err := s.cli.Get(octx, key)
	if err != nil {
		return nil, "", s.wrap(ctx, "get certificate", err)
	}
	if len(got.Kvs) == 0 {
		return nil, "", fmt.Errorf("%w: %s", record.ErrCertificateNotFound, id)
	}
	rec, err := decodeCertificate(got.Kvs[0])
	return rec, key, err
}

// RevokeCertificate marks a certificate revoked, in one compare-and-swap;
// revoking twice answers ErrCertificateRevoked. An admission that relied
// on the certificate compares its revision, so it is ordered before or
// after the revocation, never across it.
func (s *Store) RevokeCertificate(ctx context.Context, id string) (*record.Certificate, error) {
	for range 16 {
		rec, key, err := s.getCertificate(ctx, id)
		if err != nil {
			return nil, err
		}
		if rec.Revoked {
			return rec, fmt.Errorf("%w: %s", record.ErrCertificateRevoked, id)
		}
		read := rec.Revision
		now := s.now().UTC()
		rec.Revoked, rec.RevokedAt = true, &now
		val, err := encodeStored("certificate", toStoredCertificate(rec))
		if err != nil {
			return nil, err
		}
		octx, cancel := s.op(ctx)
		resp, err := s.cli.Txn(octx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", read)).
			Then(clientv3.OpPut(key, val), s.noteOp(ctx, noteCertificates, id, storedNote{State: "revoked"})).
			Commit()
		cancel()
		if err != nil {
			return nil, s.wrap(ctx, "revoke certificate", err)
		}
		if resp.Succeeded {
			rec.Revision = resp.Header.Revision
			s.log.Info("certificate revoked", "certificate", id)
			return rec, nil
		}
	}
	return nil, fmt.Errorf("%w: certificate %s", record.ErrConflict, id)
}

// CertificatesFor returns the certificates registered for calls of tool
// (its name within the server) formed on the source epoch, revoked ones
// included, ordered by id. An empty tool means every tool of the source;
// an empty source too means every certificate.
func (s *Store) CertificatesFor(ctx context.Context, source, tool string) ([]*record.Certificate, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.certificates(source, tool), clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(ctx, "certificates", err)
	}
	out := make([]*record.Certificate, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		rec, err := decodeCertificate(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// certificateKey is where rec is stored.
func (s *Store) certificateKey(rec *record.Certificate) string {
	return s.k.certificate(rec.Certificate.Source, rec.Certificate.Tool, rec.ID)
}

// certificates is the prefix of the certificates of tool on source; of
// every tool on source when tool is empty; of all when source is too.
