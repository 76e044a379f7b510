package framework

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Tenant is a team's own identity in its namespace: a ServiceAccount bound
// to the built-in admin ClusterRole by a RoleBinding there, which is what a
// platform hands a team. Its clients carry a token from the TokenRequest
// API, so the API server authenticates and authorizes every request as the
// ServiceAccount, exactly as it would a pod or a CI job of the team.
type Tenant struct {
	// User is the ServiceAccount's user name.
	User   string
	Config *rest.Config
	Client kubernetes.Interface
}

// NewTenant creates the ServiceAccount name in namespace, binds it to the
// admin ClusterRole there, and returns a client acting as it once the
// binding is in force.
func (cp *ControlPlane) NewTenant(ctx context.Context, namespace, name string) (*Tenant, error) {
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := cp.Client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating ServiceAccount %s/%s: %w", namespace, name, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name + "-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
	}
	if _, err := cp.Client.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("binding ServiceAccount %s/%s to admin: %w", namespace, name, err)
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	tok, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token of ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.BearerToken, cfg.BearerTokenFile = tok.Status.Token, ""
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	t := &Tenant{User: "system:serviceaccount:" + namespace + ":" + name, Config: cfg, Client: client}
	if err := t.waitAllowed(ctx, namespace); err != nil {
		return nil, err
	}
	return t, nil
}

// waitAllowed waits until the RBAC authorizer, which learns of bindings
// from an informer, lets the tenant create claims in its namespace.
func (t *Tenant) waitAllowed(ctx context.Context, namespace string) error {
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: "create", Group: "resource.k8s.io", Resource: "resourceclaims",
		},
	}}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err := t.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		return err == nil && out.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to be admin of %s: %w", t.User, namespace, err)
	}
	return nil
}
