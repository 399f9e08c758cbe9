package peers

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/pnet"
)

// loadIdentity reads the node's private key from path, or creates one
// there (0600, never overwriting a file another start wrote meanwhile) so
// that the peer ID, which other nodes hold in their routing tables and
// provider records, survives a restart.
func loadIdentity(path string) (crypto.PrivKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return createIdentity(path)
	}
	if err != nil {
		return nil, fmt.Errorf("peers: read key file: %w", err)
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("peers: key file %s: %w", path, err)
	}
	return k, nil
}

func createIdentity(path string) (crypto.PrivKey, error) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, err
	}
	b, err := crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, err
	}
	if err := writeNew(path, b); errors.Is(err, fs.ErrExist) {
		return loadIdentity(path)
	} else if err != nil {
		return nil, fmt.Errorf("peers: create key file: %w", err)
	}
	return k, nil
}

// loadClusterKey reads the pre-shared key every node of the cluster holds.
func loadClusterKey(path string) (pnet.PSK, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("peers: cluster key: %w", err)
	}
	defer f.Close()
	psk, err := pnet.DecodeV1PSK(f)
	if err != nil {
		return nil, fmt.Errorf("peers: cluster key %s is not a /key/swarm/psk/1.0.0/ key: %w", path, err)
	}
	return psk, nil
}

// GenerateClusterKey writes a new random cluster key to path (mode 0600),
// in the format ClusterKeyFile takes. It refuses to overwrite a file, since
// replacing the key cuts the node off from the rest of its cluster.
func GenerateClusterKey(path string) error {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	b := []byte("/key/swarm/psk/1.0.0/\n/base16/\n" + hex.EncodeToString(key) + "\n")
	if err := writeNew(path, b); err != nil {
		return fmt.Errorf("peers: write cluster key: %w", err)
	}
	return nil
}

// writeNew writes b to a new file at path, readable by its owner only.
func writeNew(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}
