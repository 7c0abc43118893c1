package k8s

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// startPod creates pod and returns how long it took from the create to a
// read that finds it Running (read every 20 ms: the API server is local).
func startPod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) (time.Duration, error) {
	t0 := time.Now()
	if _, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	for {
		p, err := cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			return time.Since(t0), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("pod %s never ran: %w", pod.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// deletePod deletes pod and waits until it is gone.
func deletePod(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	if err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		return err
	}
	for {
		if _, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func benchPod(name string, claim bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			SecurityContext:               &corev1.PodSecurityContext{RunAsUser: ptr.To(int64(1000)), RunAsGroup: ptr.To(int64(1000))},
			Containers:                    []corev1.Container{{Name: "probe", Image: probeRef, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if claim {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("units1")}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	}
	return p
}

var kubeletCallLine = regexp.MustCompile(`msg="DRA driver: kubelet call" call=NodePrepareResources seconds=([0-9.e-]+)`)

// BenchmarkDRAPodStart: a pod with a claim of one unit against the same pod
// without one, create → Running, in rounds of one of each in turns (the
// order alternating); each round's ratio is reported as median and range
// (goal: at most 1.3). Also NodePrepareResources as gpuletd timed it, the
// claims' fetch included, over every prepare of the run (goal: p99 at most
// 50 ms).
func BenchmarkDRAPodStart(b *testing.B) {
	c, _ := gpuletd(b)
	if err := c.Apply(claimTemplate("units1", 1, "")); err != nil {
		b.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(rc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var ratios []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var took [2]time.Duration
		for j := 0; j < 2; j++ {
			claim := (i+j)%2 == 0
			name := fmt.Sprintf("bench-%d-%t", i, claim)
			d, err := startPod(ctx, cs, benchPod(name, claim))
			if err != nil {
				b.Fatal(err)
			}
			if claim {
				took[0] = d
			} else {
				took[1] = d
			}
			if err := deletePod(ctx, cs, "default", name); err != nil {
				b.Fatal(err)
			}
		}
		ratios = append(ratios, took[0].Seconds()/took[1].Seconds())
	}
	b.StopTimer()
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "claim/plain-median")
	b.ReportMetric(ratios[0], "claim/plain-min")
	b.ReportMetric(ratios[len(ratios)-1], "claim/plain-max")
	logs, err := c.Kubectl("logs", "-n", "gpulet-system", "-l", "app.kubernetes.io/name=gpuletd", "--tail=-1")
	if err != nil {
		b.Fatal(err)
	}
	var prep []float64
	for _, m := range kubeletCallLine.FindAllStringSubmatch(logs, -1) {
		if s, err := strconv.ParseFloat(m[1], 64); err == nil {
			prep = append(prep, s*1000)
		}
	}
	if len(prep) > 0 {
		slices.Sort(prep)
		b.ReportMetric(prep[len(prep)/2], "prepare-p50-ms")
		b.ReportMetric(prep[(len(prep)*99)/100], "prepare-p99-ms")
		b.ReportMetric(float64(len(prep)), "prepares")
	}
}
