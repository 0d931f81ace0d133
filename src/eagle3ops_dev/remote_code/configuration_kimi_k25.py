"""Kimi-K2.5-class configuration of an eagle3ops tiny model (loaded with trust_remote_code=True)."""

from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25VisionConfig(PretrainedConfig):
    model_type = "kimi_k25_vision"

    def __init__(self, patch_size=14, init_pos_emb_height=64, init_pos_emb_width=64, init_pos_emb_time=4,
                 pos_emb_type="divided_fixed", num_attention_heads=16, num_hidden_layers=27, hidden_size=1152,
                 intermediate_size=4304, merge_kernel_size=(2, 2), video_attn_type="spatial_temporal",
                 merge_type="sd2_tpool", mm_projector_type="patchmerger", mm_hidden_size=None,
                 projector_hidden_act="gelu", projector_ln_eps=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.init_pos_emb_height = init_pos_emb_height
        self.init_pos_emb_width = init_pos_emb_width
        self.init_pos_emb_time = init_pos_emb_time
        self.pos_emb_type = pos_emb_type
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.merge_kernel_size = list(merge_kernel_size)
        self.video_attn_type = video_attn_type
        self.merge_type = merge_type
        self.mm_projector_type = mm_projector_type
        self.mm_hidden_size = hidden_size if mm_hidden_size is None else mm_hidden_size
        self.projector_hidden_act = projector_hidden_act
        self.projector_ln_eps = projector_ln_eps


class KimiK25Config(PretrainedConfig):
    """A DeepSeek-V3 text_config and a MoonViT vision_config; no flat text sizes (read text_config)."""

    model_type = "kimi_k25"

    def __init__(self, vision_config=None, text_config=None, ignore_index=-100,
                 media_placeholder_token_id=163605, pad_token_id=0, use_unified_vision_chunk=False,
                 video_placeholder="<|kimi_k25_video_placeholder|>", **kwargs):
        if vision_config is None or isinstance(vision_config, dict):
            vision_config = KimiK25VisionConfig(**(vision_config or {}))
        if text_config is None or isinstance(text_config, dict):
            text_config = DeepseekV3Config(**(text_config or {}))
        self.vision_config = vision_config
        self.text_config = text_config
        self.ignore_index = ignore_index
        self.media_placeholder_token_id = media_placeholder_token_id
        self.use_unified_vision_chunk = use_unified_vision_chunk
        self.video_placeholder = video_placeholder
        super().__init__(pad_token_id=pad_token_id, **kwargs)
