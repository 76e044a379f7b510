// Package gpunode is the dra-controller's posture plane: the GpuNode
// reconciler that keeps one GpuNode per node publishing devices of our
// driver, its status the posture of each GPU (computed by pkg/posture from
// the node's ResourceSlices, the claims allocated on it and the cluster's
// DeviceTaintRules), and the gpuaas_gpu_posture and gpuaas_node_posture
// metrics. It runs on the leader only and shares nothing with admission
// but the manager's cache.
package gpunode
