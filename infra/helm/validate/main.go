// Command validate reads the objects `helm template` rendered (YAML documents on stdin)
// and decodes each strictly into its Kubernetes API type: an unknown or misspelt field, a
// wrong type or an unknown kind fails. KEDA's ScaledObject has no Go module small enough
// to build here: it gets a structural check of the fields its Kafka scaler reads.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// typed maps apiVersion/kind to a fresh object of its Go type.
var typed = map[string]func() any{
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                     func() any { return &appsv1.StatefulSet{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"autoscaling/v2/HorizontalPodAutoscaler":  func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
}

func main() {
	n, err := validateAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid:", err)
		os.Exit(1)
	}
	fmt.Printf("%d objects decode strictly\n", n)
}

func validateAll(r io.Reader) (int, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	n := 0
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		if err := validate(doc); err != nil {
			return n, err
		}
		n++
	}
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out = append(out, line)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

func validate(doc []byte) error {
	var tm typeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	gvk := tm.APIVersion + "/" + tm.Kind
	if gvk == "keda.sh/v1alpha1/ScaledObject" {
		return checkScaledObject(doc)
	}
	make, ok := typed[gvk]
	if !ok {
		return fmt.Errorf("%s: a kind this check does not know", gvk)
	}
	if err := yaml.UnmarshalStrict(doc, make()); err != nil {
		return fmt.Errorf("%s: %w", gvk, err)
	}
	return nil
}
