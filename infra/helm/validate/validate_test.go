package main

import (
	"strings"
	"testing"
)

const deployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers: [{name: c, image: i}]
`

func TestAValidDeploymentPasses(t *testing.T) {
	if n, err := validateAll(strings.NewReader(deployment + "---\n# a comment alone\n")); err != nil || n != 1 {
		t.Fatalf("got %d objects, %v", n, err)
	}
}

func TestAMisspeltFieldIsRefused(t *testing.T) {
	bad := strings.Replace(deployment, "containers:", "container:", 1)
	if _, err := validateAll(strings.NewReader(bad)); err == nil {
		t.Fatal("a misspelt field passed")
	}
}

func TestAnUnknownKindIsRefused(t *testing.T) {
	if _, err := validateAll(strings.NewReader("apiVersion: v9\nkind: Gadget\n")); err == nil {
		t.Fatal("an unknown kind passed")
	}
}

func TestAKafkaTriggerWithAnUnknownSettingIsRefused(t *testing.T) {
	so := `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: w}
spec:
  scaleTargetRef: {name: w}
  triggers:
    - type: kafka
      metadata: {bootstrapServers: k:9092, consumerGroup: g, topic: t, lagThreshold: "5", lagTreshold: "5"}
`
	if _, err := validateAll(strings.NewReader(so)); err == nil || !strings.Contains(err.Error(), "lagTreshold") {
		t.Fatalf("got %v", err)
	}
}
