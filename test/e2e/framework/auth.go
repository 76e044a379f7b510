package framework

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// writeServiceAccountKey generates the RSA key the apiserver signs
// service-account tokens with (and the controller-manager too) and writes the
// private and public halves as PEM files.
func writeServiceAccountKey(dir string) (keyPath, pubPath string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", fmt.Errorf("generating service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("encoding service-account public key: %w", err)
	}
	keyPath, pubPath = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writePEM(keyPath, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)); err != nil {
		return "", "", err
	}
	if err := writePEM(pubPath, "PUBLIC KEY", pub); err != nil {
		return "", "", err
	}
	return keyPath, pubPath, nil
}

func writePEM(path, blockType string, der []byte) error {
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// writeTokenFile writes a static token file with one admin user in
// system:masters, so every client (tests, scheduler, plugin, kubectl) can
// authenticate without a CA or client certificates.
func writeTokenFile(dir string) (path, token string, err error) {
	buf := make([]byte, 16)
	if _, err := rand.Read(buf); err != nil {
		return "", "", fmt.Errorf("generating admin token: %w", err)
	}
	token = hex.EncodeToString(buf)
	path = filepath.Join(dir, "tokens.csv")
	line := token + ",admin,admin-uid,system:masters\n"
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		return "", "", fmt.Errorf("writing token file: %w", err)
	}
	return path, token, nil
}

// restConfig is the admin client configuration. The apiserver's serving
// certificate is self-signed, so TLS verification is skipped: this cluster
// only ever listens on loopback.
func restConfig(port int, token string) *rest.Config {
	return &rest.Config{
		Host:            "https://" + net.JoinHostPort("127.0.0.1", fmt.Sprint(port)),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             100,
		Burst:           200,
	}
}

// writeKubeconfig writes cfg as a kubeconfig file for other processes.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cfg.Host, InsecureSkipTLSVerify: true}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "admin", Namespace: "default"}
	kc.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// ServiceAccountKubeconfig writes a kubeconfig at path that acts as the
// ServiceAccount namespace/name, with a token from the TokenRequest API: a
// process started with it has exactly the RBAC a pod of that account has.
func (cp *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, namespace, name, path string) error {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	tok, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token of ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.BearerToken, cfg.BearerTokenFile = tok.Status.Token, ""
	return writeKubeconfig(path, cfg)
}
