from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    """?page=N&page_size=M (at most 500); the body says how many there are in all."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
