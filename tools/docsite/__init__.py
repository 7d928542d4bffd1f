"""The documentation site's generators (mkdocs.yml's hooks): pages made from the code, so they cannot drift."""
