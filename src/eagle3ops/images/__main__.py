"""``python -m eagle3ops.images [NAME]``: print the content tag of image definition NAME (default ``pipeline``)."""

import sys

from eagle3ops.images.tags import content_tag

if __name__ == "__main__":  # pragma: no cover
    print(content_tag(sys.argv[1] if len(sys.argv) > 1 else "pipeline"))
