// nullbinder-dra: a scheduler for claim pods that costs nothing, the ceiling gpuplace's claim
// allocation is measured against (issue 79). It watches pods with spec.schedulerName NAME and
// no node whose one ResourceClaim is named in spec.resourceClaims, and gives pod k (in arrival
// order) device gpu-D of node k mod NODES (n0000..., as scripts/realapi-load.py makes them;
// D = (k / NODES) mod GPUS, so no device is given twice while pods < NODES x GPUS) with the
// same three writes gpuplace and kube-scheduler make: the claim's delete-protection
// finalizer, its status (allocation and reservedFor), then the Binding. WORKERS pods in
// flight. No scheduling: the API server's own ceiling for these writes.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const finalizer = "resource.kubernetes.io/delete-protection"

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
	name := flag.String("scheduler-name", "nullgo", "spec.schedulerName to serve")
	nodes := flag.Int("nodes", 500, "nodes n0000 to n<NODES-1>")
	gpus := flag.Int("gpus", 8, "devices gpu-0 to gpu-<GPUS-1> a node")
	driver := flag.String("driver", "gpu.gpuplace.io", "the driver the allocation names")
	workers := flag.Int("workers", 64, "pods in flight")
	flag.Parse()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		panic(err)
	}
	cfg.QPS, cfg.Burst = 100000, 100000
	cs := kubernetes.NewForConfigOrDie(cfg)
	work := make(chan *v1.Pod, 100000)
	var seen sync.Map
	var k int64
	f := informers.NewSharedInformerFactory(cs, 0)
	f.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o interface{}) {
			p := o.(*v1.Pod)
			if p.Spec.SchedulerName == *name && p.Spec.NodeName == "" {
				if _, dup := seen.LoadOrStore(p.UID, true); !dup {
					work <- p
				}
			}
		},
	})
	for i := 0; i < *workers; i++ {
		go func() {
			for p := range work {
				i := int(atomic.AddInt64(&k, 1) - 1)
				node := fmt.Sprintf("n%04d", i%*nodes)
				device := fmt.Sprintf("gpu-%d", (i / *nodes)%*gpus)
				if err := place(cs, p, node, device, *driver); err != nil {
					fmt.Fprintln(os.Stderr, "pod", p.Name, err)
				}
			}
		}()
	}
	stop := make(chan struct{})
	f.Start(stop)
	select {}
}

// place writes the claim's finalizer, its allocation of `device` on `node` with the pod in
// reservedFor, then the pod's Binding.
func place(cs *kubernetes.Clientset, p *v1.Pod, node, device, driver string) error {
	ctx := context.Background()
	if len(p.Spec.ResourceClaims) != 1 || p.Spec.ResourceClaims[0].ResourceClaimName == nil {
		return fmt.Errorf("asks no claim of its own by name")
	}
	claim := *p.Spec.ResourceClaims[0].ResourceClaimName
	claims := cs.ResourceV1().ResourceClaims(p.Namespace)
	meta, _ := json.Marshal(map[string]interface{}{
		"metadata": map[string]interface{}{"finalizers": []string{finalizer}}})
	if _, err := claims.Patch(ctx, claim, types.MergePatchType, meta, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("finalizer: %w", err)
	}
	status, _ := json.Marshal(map[string]interface{}{"status": map[string]interface{}{
		"allocation": map[string]interface{}{
			"devices": map[string]interface{}{"results": []map[string]interface{}{
				{"request": "gpu", "driver": driver, "pool": node, "device": device}}},
			"nodeSelector": map[string]interface{}{"nodeSelectorTerms": []map[string]interface{}{
				{"matchFields": []map[string]interface{}{
					{"key": "metadata.name", "operator": "In", "values": []string{node}}}}}},
		},
		"reservedFor": []map[string]interface{}{
			{"resource": "pods", "name": p.Name, "uid": string(p.UID)}},
	}})
	if _, err := claims.Patch(ctx, claim, types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("allocation: %w", err)
	}
	b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		Target: v1.ObjectReference{Kind: "Node", Name: node}}
	return cs.CoreV1().Pods(p.Namespace).Bind(ctx, b, metav1.CreateOptions{})
}
