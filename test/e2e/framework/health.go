package framework

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// pollInterval is how often the wait helpers look again. The control plane
// reacts in tens of milliseconds, so a short interval keeps tests fast.
const pollInterval = 100 * time.Millisecond

// insecureClient talks to the components' self-signed HTTPS endpoints.
var insecureClient = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
}

// waitHealthy polls url until it answers 200, the context ends, or proc
// exits (then its log tail is part of the error, which is what one needs to
// see when, say, a flag was rejected).
func waitHealthy(ctx context.Context, proc *Process, url, token string) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		if exited, err := proc.Exited(); exited {
			return false, fmt.Errorf("%s exited (%w); last log lines:\n%s", proc.Name, err, proc.Tail(30))
		}
		ok, msg := probe(ctx, url, token)
		last = msg
		return ok, nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("waiting for %s: %w", proc.Name, ctx.Err())
	case ctx.Err() != nil:
		return fmt.Errorf("%s not healthy at %s (last answer: %.300s); log: %s: %w", proc.Name, url, last, proc.LogPath, ctx.Err())
	}
	return err
}

func probe(ctx context.Context, url, token string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecureClient.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, body)
}

// WaitForServiceAccount waits until the serviceaccount controller created the
// "default" ServiceAccount of a namespace: the ServiceAccount admission
// plugin rejects pods until then.
func WaitForServiceAccount(ctx context.Context, client kubernetes.Interface, namespace string) error {
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("waiting for ServiceAccount %s/default: %w", namespace, err)
	}
	return nil
}
