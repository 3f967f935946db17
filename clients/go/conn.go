package timeshard

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// DefaultServer is the node dialled when neither Config.Servers nor TIMESHARD_SERVER names one.
const DefaultServer = "127.0.0.1:50051"

// The environment read by ConfigFromEnv, the same the Python SDK and the CLI read.
const (
	EnvServer     = "TIMESHARD_SERVER"          // comma-separated host:port list
	EnvTLSDir     = "TIMESHARD_TLS_DIR"         // ca.pem, and client.pem + client-key.pem for mTLS
	EnvServerName = "TIMESHARD_TLS_SERVER_NAME" // the name checked against the server's certificate
	EnvToken      = "TIMESHARD_TOKEN"           // the role token, sent as a bearer token
)

// The files of a TLS directory (the names `timeshard certs init` writes).
const (
	caFile         = "ca.pem"
	clientCertFile = "client.pem"
	clientKeyFile  = "client-key.pem"
)

// maxReplyBytes is the largest message this SDK's channels accept, and what a worker tells a
// node its claims may fill (the server's limit, 64 MiB).
const maxReplyBytes = 64 * 1024 * 1024

// Config says how to reach a timeshard cluster. The zero value of a field means its default;
// ConfigFromEnv fills the fields from the environment.
type Config struct {
	// Servers are host:port addresses of nodes. A client calls the first and fails over to the
	// next; a worker asks them for the cluster's members and claims from every one.
	Servers []string
	// TLSDir is a directory with ca.pem (the CA of the nodes' certificates) and, for mutual TLS,
	// client.pem and client-key.pem. Empty: plaintext.
	TLSDir string
	// ServerName overrides the name checked against the nodes' certificates.
	ServerName string
	// Token is the role token (client, worker or admin), sent as "authorization: Bearer".
	Token string
}

// ConfigFromEnv reads TIMESHARD_SERVER, TIMESHARD_TLS_DIR, TIMESHARD_TLS_SERVER_NAME and
// TIMESHARD_TOKEN.
func ConfigFromEnv() Config {
	var servers []string
	for _, s := range strings.Split(os.Getenv(EnvServer), ",") {
		if s = strings.TrimSpace(s); s != "" {
			servers = append(servers, s)
		}
	}
	return Config{
		Servers:    servers,
		TLSDir:     os.Getenv(EnvTLSDir),
		ServerName: os.Getenv(EnvServerName),
		Token:      strings.TrimSpace(os.Getenv(EnvToken)),
	}
}

func (c Config) servers() []string {
	if len(c.Servers) == 0 {
		return []string{DefaultServer}
	}
	return c.Servers
}

// transport is the channel credentials of the config: TLS from TLSDir, or plaintext.
func (c Config) transport() (credentials.TransportCredentials, error) {
	if c.TLSDir == "" {
		return insecure.NewCredentials(), nil
	}
	ca, err := readPEM(c.TLSDir, caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("timeshard: TLS dir %s: %s holds no certificate", c.TLSDir, caFile)
	}
	conf := &tls.Config{RootCAs: pool, ServerName: c.ServerName, MinVersion: tls.VersionTLS12}
	certPath := filepath.Join(c.TLSDir, clientCertFile)
	keyPath := filepath.Join(c.TLSDir, clientKeyFile)
	if exists(certPath) || exists(keyPath) {
		pair, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return nil, fmt.Errorf("timeshard: TLS dir %s: client certificate: %w", c.TLSDir, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(conf), nil
}

func readPEM(dir, name string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("timeshard: TLS dir %s: %w", dir, err)
	}
	if !strings.Contains(string(data), "-----BEGIN") {
		return nil, fmt.Errorf("timeshard: TLS dir %s: %s is not a PEM file", dir, name)
	}
	return data, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// dial opens a channel to one node. The token rides on every call as metadata (an
// interceptor, so it works on plaintext loopback channels too, as the Python SDK's does).
func (c Config) dial(address string) (*grpc.ClientConn, error) {
	creds, err := c.transport()
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxReplyBytes)),
	}
	if c.Token != "" {
		bearer := "Bearer " + c.Token
		opts = append(opts, grpc.WithUnaryInterceptor(func(
			ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
			invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption,
		) error {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", bearer)
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}))
	}
	conn, err := grpc.NewClient(address, opts...)
	if err != nil {
		return nil, fmt.Errorf("timeshard: can not dial %q: %w", address, err)
	}
	return conn, nil
}
