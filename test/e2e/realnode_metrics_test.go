package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	metricsReaderRole = releaseName + "-gpuaas-dra-controller-metrics-reader"
	scraperAccount    = "metrics-scraper"
)

// scrapeMetrics GETs a controller replica's /metrics over HTTPS (its
// certificate is self-signed: the scraper trusts the address, as
// Prometheus trusts a Service) with a bearer token, "" for none.
func scrapeMetrics(ctx context.Context, port int, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed, on this host
	return httpGet(client, req)
}

// httpGet does req with client and returns the status and body.
func httpGet(client *http.Client, req *http.Request) (int, string, error) {
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// serviceAccountToken creates (once) a ServiceAccount in the release's
// namespace, bound to role when role is not empty, and returns a token of it.
func serviceAccountToken(t *testing.T, ctx context.Context, name, role string) string {
	t.Helper()
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: releaseNamespace}}
	if _, err := cp.Client.CoreV1().ServiceAccounts(releaseNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if role != "" {
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: releaseNamespace}},
		}
		if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	tok, err := cp.Client.CoreV1().ServiceAccounts(releaseNamespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Status.Token
}

// testMetricsNeedAuthorization: the controller's /metrics, which name every
// tenant and its usage, were plain HTTP for anyone on the pod network. Now
// an anonymous caller and one not granted get on /metrics are refused, and
// a scraper bound to the chart's metrics-reader ClusterRole reads them.
func testMetricsNeedAuthorization(t *testing.T, _ *realNode) {
	ctx := framework.Context(t, 2*time.Minute)
	r := chartControllerReplica(t, ctx)
	for _, c := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a ServiceAccount without the role", serviceAccountToken(t, ctx, "no-metrics", ""), http.StatusForbidden},
		{"the metrics reader", serviceAccountToken(t, ctx, scraperAccount, metricsReaderRole), http.StatusOK},
	} {
		code, body, err := scrapeMetrics(ctx, r.metricsPort, c.token)
		if err != nil {
			t.Fatalf("%s: %v", c.who, err)
		}
		if code != c.want {
			t.Errorf("%s: HTTP %d, want %d", c.who, code, c.want)
		}
		if code == http.StatusOK && !strings.Contains(body, "gpuaas_claim_admissions_total") {
			t.Errorf("%s: metrics lack gpuaas_claim_admissions_total", c.who)
		}
		t.Logf("%s: HTTP %d", c.who, code)
	}
	code, _, err := scrapeHTTP(ctx, r.metricsPort)
	if err == nil && code == http.StatusOK {
		t.Errorf("/metrics still answers plain HTTP")
	}
}

// scrapeHTTP tries plain HTTP, which must not be served.
func scrapeHTTP(ctx context.Context, port int) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	return resp.StatusCode, "", nil
}
