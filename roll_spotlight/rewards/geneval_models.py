"""Local model directories behind the `geneval` and `pickscore` rewards (torch + transformers).

* `local_model_dir`: a directory's config.json, checked before any weight is read: a missing
  directory or another architecture is a ValueError naming the config key. Nothing is downloaded
  (`local_files_only=True` everywhere).
* `Mask2FormerDetector`: instance segmentation by `Mask2FormerForUniversalSegmentation`, post-processed
  like mmdet's Mask2Former (the detector GenEval runs): per image the top `top_k` (query, class)
  pairs by class probability, mask logits upsampled to the padded input, cropped to the resized
  image, resized to the original size; binary mask = logit > 0; score = class probability x mean
  mask probability inside the binary mask; box = the binary mask's extent (x2, y2 exclusive).
* `ClipColorClassifier`: GenEval's colour rule: the object's pixels on a grey (#999) background,
  cropped to its box, classified zero-shot among GenEval's colours with three templates per colour.

Image processors are the PIL ones when torchvision is absent (transformers picks them itself), so
torchvision is never required. scipy is: transformers builds Mask2Former's training loss (Hungarian
matching) in the model's constructor, even for inference; it is checked when the reward is built.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from roll_spotlight.rewards.geneval_rules import Detection, check_class_names
from roll_spotlight.tasks.prompt_files import GENEVAL_CLASSES, GENEVAL_COLORS

# Names other COCO label maps use for GenEval's classes (HF and mmdet checkpoints differ).
CLASS_ALIASES = {
    "motorbike": "motorcycle", "aeroplane": "airplane", "sofa": "couch", "pottedplant": "potted plant",
    "diningtable": "dining table", "tvmonitor": "tv", "tv monitor": "tv", "mouse": "computer mouse",
    "remote": "tv remote", "keyboard": "computer keyboard", "hair dryer": "hair drier",
    "cellphone": "cell phone", "doughnut": "donut",
}
COLOR_TEMPLATES = ("a photo of a {c} {name}", "a photo of a {c}-colored {name}", "a photo of a {c} object")
CROP_BACKGROUND = (153, 153, 153)  # GenEval's "#999"


def local_model_dir(path: str | None, key: str, model_types: tuple[str, ...]) -> dict[str, Any]:
    """config.json of a local model directory whose model_type is one of `model_types`."""
    if not path:
        raise ValueError(f"{key} must name a local model directory (nothing is downloaded)")
    config = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise ValueError(f"{key}={path!r}: no such directory (nothing is downloaded; put the model there)")
    if not config.is_file():
        raise ValueError(f"{key}={path!r}: no config.json, not a transformers model directory")
    data = json.loads(config.read_text(encoding="utf-8"))
    found = data.get("model_type")
    if found not in model_types:
        raise ValueError(f"{key}={path!r}: found model_type {found!r} (architectures "
                         f"{data.get('architectures')}), expected {' or '.join(model_types)}")
    return data


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def geneval_label_names(id2label: dict[Any, str]) -> dict[int, str]:
    """label id -> GenEval class for the labels that are COCO things (stuff labels are dropped)."""
    names = {}
    for index, label in id2label.items():
        name = str(label).strip().lower().replace("_", " ")
        name = CLASS_ALIASES.get(name, name)
        if name in GENEVAL_CLASSES:
            names[int(index)] = name
    return names


def embedding(output: Any) -> Any:
    """CLIP features: transformers < 5 returns a tensor, 5 a pooled output holding the projection."""
    return output if hasattr(output, "norm") else output.pooler_output


@dataclass
class ClipBundle:
    model: Any
    processor: Any
    device: str


def load_clip(path: str, key: str, device: str, processor_path: str | None = None,
              processor_key: str = "") -> ClipBundle:
    """CLIPModel (eval, on device) and its CLIPProcessor from local directories."""
    local_model_dir(path, key, ("clip",))
    from transformers import CLIPModel, CLIPProcessor

    source = processor_path or path
    try:
        processor = CLIPProcessor.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        where = processor_key if processor_path else key
        raise ValueError(f"{where}={source!r}: cannot load a CLIP processor (tokenizer + image "
                         f"processor) from it: {err}") from err
    model = CLIPModel.from_pretrained(path, local_files_only=True).eval().to(device)
    return ClipBundle(model, processor, device)


class Mask2FormerDetector:
    """Images -> per image, GenEval class -> detections (score > that image's cutoff), best first."""

    def __init__(self, path: str, key: str, device: str, batch_size: int = 4, top_k: int = 100) -> None:
        """Checks the directory now (architecture, COCO labels); reads the weights on the first call."""
        config = local_model_dir(path, key, ("mask2former",))
        self.labels = geneval_label_names(config.get("id2label", {}))
        try:
            check_class_names(list(self.labels.values()))
        except ValueError as err:
            raise ValueError(f"{key}={path!r}: {err}; its labels are {sorted(config.get('id2label', {}).values())}") from None
        if importlib.util.find_spec("scipy") is None:  # transformers' Mask2Former builds its loss, which needs it
            raise ImportError("the geneval reward needs scipy (transformers' Mask2FormerForUniversalSegmentation "
                              "requires it to be built): pip install 'roll_spotlight[geneval]'")
        self.path, self.device, self.batch_size, self.top_k = path, device, batch_size, top_k
        self.model = self.processor = None

    def _load(self) -> None:
        from transformers import AutoImageProcessor, Mask2FormerForUniversalSegmentation

        self.processor = AutoImageProcessor.from_pretrained(self.path, local_files_only=True)
        self.model = Mask2FormerForUniversalSegmentation.from_pretrained(self.path, local_files_only=True)
        self.model = self.model.eval().to(self.device)

    def __call__(self, images: np.ndarray, cutoffs: list[float]) -> list[dict[str, list[Detection]]]:
        if self.model is None:
            self._load()
        out = []
        for start in range(0, len(images), self.batch_size):
            batch = images[start:start + self.batch_size]
            out += self._detect(batch, cutoffs[start:start + self.batch_size])
        return out

    def _detect(self, images: np.ndarray, cutoffs: list[float]) -> list[dict[str, list[Detection]]]:
        import torch

        inputs = self.processor(images=list(images), return_tensors="pt")
        with torch.no_grad():
            pred = self.model(pixel_values=inputs["pixel_values"].to(self.device),
                              pixel_mask=inputs["pixel_mask"].to(self.device))
        padded = tuple(inputs["pixel_values"].shape[-2:])
        return [self._instances(pred.class_queries_logits[i], pred.masks_queries_logits[i], padded,
                                inputs["pixel_mask"][i], images[i].shape[:2], cutoffs[i])
                for i in range(len(images))]

    def _instances(self, class_logits, mask_logits, padded, pixel_mask, size, cutoff) -> dict[str, list[Detection]]:
        probs = class_logits.float().softmax(-1)[:, :-1]  # drop the "no object" class
        num_classes = probs.shape[1]
        top, index = probs.flatten().topk(min(self.top_k, probs.numel()))
        keep = top > cutoff  # score = prob x mask score <= prob: nothing else can pass the cutoff
        top, index = top[keep], index[keep]
        if not len(index):
            return {}
        masks = _masks_at(mask_logits[index // num_classes].float(), padded, pixel_mask, size)
        binary = masks > 0
        mask_score = (masks.sigmoid() * binary).flatten(1).sum(1) / (binary.flatten(1).sum(1) + 1e-6)
        scores = (top * mask_score).cpu().numpy()
        found: dict[str, list[Detection]] = {}
        for k, label in enumerate((index % num_classes).tolist()):
            name = self.labels.get(label)
            if name is not None and scores[k] > cutoff:
                mask = binary[k].cpu().numpy()
                found.setdefault(name, []).append(Detection(_mask_box(mask), float(scores[k]), mask))
        return {name: sorted(dets, key=lambda d: -d.score) for name, dets in found.items()}


def _masks_at(mask_logits, padded: tuple[int, int], pixel_mask, size: tuple[int, int]):
    """Mask logits (N, h, w) -> (N, H, W) at the original image size, as mmdet resizes them."""
    import torch.nn.functional as F

    masks = F.interpolate(mask_logits[None], size=padded, mode="bilinear", align_corners=False)[0]
    valid_h = int(pixel_mask.any(dim=1).sum())
    valid_w = int(pixel_mask.any(dim=0).sum())
    masks = masks[:, :valid_h, :valid_w]
    return F.interpolate(masks[None], size=tuple(size), mode="bilinear", align_corners=False)[0]


def _mask_box(mask: np.ndarray) -> tuple[float, float, float, float]:
    """(x1, y1, x2, y2) of a boolean mask, x2/y2 one past the last pixel; zeros for an empty mask."""
    ys, xs = np.nonzero(mask)
    if not len(xs):
        return (0.0, 0.0, 0.0, 0.0)
    return (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))


class ClipColorClassifier:
    """(image, class, detections) -> one of GenEval's colours per detection."""

    def __init__(self, clip: ClipBundle) -> None:
        self.clip = clip
        self._classifiers: dict[str, Any] = {}

    def __call__(self, image: np.ndarray, name: str, detections: list[Detection]) -> list[str]:
        import torch

        if not detections:
            return []
        crops = [object_crop(image, det) for det in detections]
        inputs = self.clip.processor(images=crops, return_tensors="pt")
        with torch.no_grad():
            features = embedding(self.clip.model.get_image_features(
                pixel_values=inputs["pixel_values"].to(self.clip.device)))
        features = features.float() / features.float().norm(dim=-1, keepdim=True)
        choice = (features @ self._classifier(name).T).argmax(-1).tolist()
        return [GENEVAL_COLORS[i] for i in choice]

    def _classifier(self, name: str):
        """(colours, D): per colour the normalised mean of its normalised template embeddings."""
        import torch

        if name not in self._classifiers:
            texts = [t.format(c=c, name=name) for c in GENEVAL_COLORS for t in COLOR_TEMPLATES]
            tokens = self.clip.processor(text=texts, return_tensors="pt", padding=True)
            with torch.no_grad():
                text = embedding(self.clip.model.get_text_features(
                    input_ids=tokens["input_ids"].to(self.clip.device),
                    attention_mask=tokens["attention_mask"].to(self.clip.device))).float()
            text = text / text.norm(dim=-1, keepdim=True)
            mean = text.reshape(len(GENEVAL_COLORS), len(COLOR_TEMPLATES), -1).mean(1)
            self._classifiers[name] = mean / mean.norm(dim=-1, keepdim=True)
        return self._classifiers[name]


def object_crop(image: np.ndarray, det: Detection) -> np.ndarray:
    """The object's pixels (others grey) inside its box, at least one pixel wide and high."""
    canvas = image
    if det.mask is not None:
        canvas = np.where(det.mask[..., None], image, np.array(CROP_BACKGROUND, dtype=np.uint8))
    h, w = image.shape[:2]
    x1, y1, x2, y2 = (round(v) for v in det.box)
    x1, y1 = min(max(x1, 0), w - 1), min(max(y1, 0), h - 1)
    x2, y2 = max(min(x2, w), x1 + 1), max(min(y2, h), y1 + 1)
    return np.ascontiguousarray(canvas[y1:y2, x1:x2])
