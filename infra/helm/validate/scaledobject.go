package main

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// The fields of KEDA's ScaledObject (keda.sh/v1alpha1) this chart writes, as in KEDA's
// CRD; strict decoding refuses any other.
type scaledObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace,omitempty"`
		Labels    map[string]string `json:"labels,omitempty"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion,omitempty"`
			Kind       string `json:"kind,omitempty"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		Triggers        []struct {
			Type              string            `json:"type"`
			Metadata          map[string]string `json:"metadata"`
			AuthenticationRef *struct {
				Name string `json:"name"`
				Kind string `json:"kind,omitempty"`
			} `json:"authenticationRef,omitempty"`
		} `json:"triggers"`
	} `json:"spec"`
}

// The metadata KEDA's Kafka scaler reads (keda.sh/docs/scalers/apache-kafka).
var kafkaRequired = []string{"bootstrapServers", "consumerGroup", "topic", "lagThreshold"}
var kafkaKnown = map[string]bool{
	"bootstrapServers": true, "consumerGroup": true, "topic": true, "lagThreshold": true,
	"activationLagThreshold": true, "offsetResetPolicy": true, "allowIdleConsumers": true,
	"excludePersistentLag": true, "scaleToZeroOnInvalidOffset": true, "limitToPartitionsWithLag": true,
	"partitionLimitation": true, "version": true, "sasl": true, "tls": true,
}

func checkScaledObject(doc []byte) error {
	var so scaledObject
	if err := yaml.UnmarshalStrict(doc, &so); err != nil {
		return fmt.Errorf("ScaledObject: %w", err)
	}
	if so.Metadata.Name == "" || so.Spec.ScaleTargetRef.Name == "" {
		return fmt.Errorf("ScaledObject: a name and a scaleTargetRef.name are required")
	}
	if min, max := so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount; min != nil && max != nil && *min > *max {
		return fmt.Errorf("ScaledObject %s: minReplicaCount %d > maxReplicaCount %d", so.Metadata.Name, *min, *max)
	}
	if len(so.Spec.Triggers) == 0 {
		return fmt.Errorf("ScaledObject %s: no trigger", so.Metadata.Name)
	}
	for _, t := range so.Spec.Triggers {
		if t.Type != "kafka" {
			continue
		}
		for _, k := range kafkaRequired {
			if t.Metadata[k] == "" {
				return fmt.Errorf("ScaledObject %s: the kafka trigger needs %s", so.Metadata.Name, k)
			}
		}
		for k := range t.Metadata {
			if !kafkaKnown[k] {
				return fmt.Errorf("ScaledObject %s: the kafka scaler has no setting %q", so.Metadata.Name, k)
			}
		}
	}
	return nil
}
