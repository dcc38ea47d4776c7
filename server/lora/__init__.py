"""LoRA adapters served beside the base model: reading PEFT folders into the model's fused
layout, and (to come) the adapters' device slots and the batched products of a step."""
