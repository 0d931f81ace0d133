"""Stand-in image processor of an eagle3ops tiny Kimi-K2.5-class model (trust_remote_code=True).

vLLM 0.16 loads the image processor when it sets up Kimi-K2.5's multimodal processing info, even with
limit_mm_per_prompt {"vision_chunk": 0}. This one answers the sizes vLLM asks for and refuses to process media.
"""

import math

from transformers.image_processing_utils import BaseImageProcessor


class KimiK25VisionProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values", "grid_thws"]

    def __init__(self, patch_size=14, merge_kernel_size=(2, 2), num_frames_per_chunk=4, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.merge_kernel_size = list(merge_kernel_size)
        self.num_frames_per_chunk = num_frames_per_chunk

    def media_tokens_calculator(self, chunk):
        """Tokens one vision chunk becomes: merged patches of its first frame (temporal pooling)."""
        image = chunk["image"] if chunk.get("type") == "image" else chunk["video_chunk"][0]
        w, h = image.size
        kh, kw = self.merge_kernel_size
        return math.ceil(h / (self.patch_size * kh)) * math.ceil(w / (self.patch_size * kw))

    def split_video_chunks(self, video):
        return [video[i : i + self.num_frames_per_chunk] for i in range(0, len(video), self.num_frames_per_chunk)]

    def preprocess(self, *args, **kwargs):
        raise NotImplementedError("stand-in image processor of a tiny test model: the vision modality is off")
