package framework

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

// Annotations by which a workload names the OpenShift AI HardwareProfile
// it was started with (what the dashboard writes).
const (
	HardwareProfileNameAnnotation      = "opendatahub.io/hardware-profile-name"
	HardwareProfileNamespaceAnnotation = "opendatahub.io/hardware-profile-namespace"
)

// DashboardJob is a suspended one-pod Job of image as the OpenShift AI
// dashboard's admission leaves a workload that names HardwareProfile hp:
// the profile named in its annotations, each identifier's defaultCount in
// the container's requests and limits, and for a Queue profile Kueue's
// queue label (and priority class label). It is the dashboard's contract
// as the tests and the demo exercise it, not the dashboard's code.
func DashboardJob(namespace, name, image string, hp *unstructured.Unstructured) (*batchv1.Job, error) {
	ids, _, err := unstructured.NestedSlice(hp.Object, "spec", "identifiers")
	if err != nil {
		return nil, fmt.Errorf("HardwareProfile %s: spec.identifiers: %w", hp.GetName(), err)
	}
	resources := v1.ResourceList{}
	for _, id := range ids {
		m, ok := id.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("HardwareProfile %s: identifier %v is no object", hp.GetName(), id)
		}
		name, _ := m["identifier"].(string)
		q, err := resource.ParseQuantity(fmt.Sprint(m["defaultCount"]))
		if err != nil {
			return nil, fmt.Errorf("HardwareProfile %s: identifier %v: its defaultCount is no quantity: %w", hp.GetName(), m, err)
		}
		if name == "" {
			return nil, fmt.Errorf("HardwareProfile %s: identifier %v has no identifier", hp.GetName(), m)
		}
		resources[v1.ResourceName(name)] = q
	}
	labels := map[string]string{}
	if queue, ok, _ := unstructured.NestedString(hp.Object, "spec", "scheduling", "kueue", "localQueueName"); ok && queue != "" {
		labels["kueue.x-k8s.io/queue-name"] = queue
	}
	if pc, ok, _ := unstructured.NestedString(hp.Object, "spec", "scheduling", "kueue", "priorityClass"); ok && pc != "" {
		labels["kueue.x-k8s.io/priority-class"] = pc
	}
	annotations := map[string]string{HardwareProfileNameAnnotation: hp.GetName(), HardwareProfileNamespaceAnnotation: hp.GetNamespace()}
	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels, Annotations: annotations},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](1), Completions: ptr.To[int32](1), Suspend: ptr.To(true),
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: annotations},
				Spec: v1.PodSpec{
					RestartPolicy: v1.RestartPolicyNever,
					Containers: []v1.Container{{
						Name: "main", Image: image,
						Resources: v1.ResourceRequirements{Requests: resources, Limits: resources.DeepCopy()},
					}},
				},
			},
		},
	}, nil
}
