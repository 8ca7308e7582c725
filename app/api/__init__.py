"""The HTTP surface: dependencies and one route module per resource."""
